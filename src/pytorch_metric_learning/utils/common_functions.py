"""2.x import path: ``from pytorch_metric_learning.utils import common_functions as c_f``.

Re-exports, plus two module-level settings of 2.x that code assigns to:
``COLLECT_STATS`` (the default of every distance's ``collect_stats``) and
``NUMPY_RANDOM`` (the generator of :func:`safe_random_choice`).
``LOGGER`` and ``LOGGER_NAME`` are looked up when read, so that after
``set_logger_name("name")`` they are the renamed logger and its name, as in 2.x; records of
the package's module loggers reach that logger's handlers too (see
:mod:`pytorch_metric_learning._logging`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .._logging import legacy_logger, legacy_logger_name, set_logger_name
from ..testers.label_mapper import LabelMapper
from ._datasets import EmbeddingDataset, get_eval_dataloader
from ._label_helpers import (
    get_hierarchy_label,
    get_label_map,
    get_labels_to_indices,
    make_label_to_rank_dict,
    map_labels,
    process_label,
)
from ._model_files import (
    delete_dict_of_models,
    latest_version,
    load_dict_of_models,
    load_model,
    modelpath_creator,
    operate_on_dict_of_models,
    save_dict_of_models,
    save_model,
)
from ._record_rows import sqlite_obj_to_dict
from ._tensor_helpers import (
    check_shapes,
    is_list_or_tuple,
    neg_inf,
    numpy_to_torch,
    pos_inf,
    set_ref_emb,
    small_val,
    to_device,
    to_dtype,
    to_numpy,
    torch_all_from_dim_to_end,
    torch_arange_from_size,
    torch_standard_scaler,
    use_cuda_if_available,
)
from ._training_helpers import (
    TorchInitWrapper,
    get_train_dataloader,
    return_input,
    set_layers_to_eval,
    set_requires_grad,
    try_next_on_generator,
)

__all__ = [
    "LOGGER",
    "LOGGER_NAME",
    "set_logger_name",
    "EmbeddingDataset",
    "LabelMapper",
    "get_label_map",
    "make_label_to_rank_dict",
    "get_hierarchy_label",
    "map_labels",
    "process_label",
    "get_eval_dataloader",
    "torch_all_from_dim_to_end",
    "torch_standard_scaler",
    "to_device",
    "to_dtype",
    "to_numpy",
    "numpy_to_torch",
    "check_shapes",
    "is_list_or_tuple",
    "use_cuda_if_available",
    "modelpath_creator",
    "save_model",
    "load_model",
    "latest_version",
    "save_dict_of_models",
    "load_dict_of_models",
    "delete_dict_of_models",
    "COLLECT_STATS",
    "NUMPY_RANDOM",
    "pos_inf",
    "neg_inf",
    "small_val",
    "torch_arange_from_size",
    "set_ref_emb",
    "get_labels_to_indices",
    "safe_random_choice",
    "operate_on_dict_of_models",
    "sqlite_obj_to_dict",
    "TorchInitWrapper",
    "get_train_dataloader",
    "return_input",
    "set_layers_to_eval",
    "set_requires_grad",
    "try_next_on_generator",
]

# 2.x's switch for the statistics distances collect; read by BaseDistance(collect_stats=None).
COLLECT_STATS = False
# The generator safe_random_choice draws from; assign e.g. np.random.RandomState(0).
NUMPY_RANDOM: Any = np.random


def safe_random_choice(input_data: Any, size: int) -> np.ndarray:
    """``size`` random elements of ``input_data``: without replacement when it has at
    least ``size`` elements, with replacement otherwise. Draws from ``NUMPY_RANDOM``.

    Example:
        >>> sorted(safe_random_choice([1, 2, 3], 3).tolist())
        [1, 2, 3]
        >>> len(safe_random_choice([1], 4))
        4
    """
    replace = len(input_data) < size
    return NUMPY_RANDOM.choice(input_data, size=size, replace=replace)


LOGGER: logging.Logger  # provided by __getattr__ below
LOGGER_NAME: str


def __getattr__(name: str) -> object:
    if name == "LOGGER":
        return legacy_logger()
    if name == "LOGGER_NAME":
        return legacy_logger_name()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
