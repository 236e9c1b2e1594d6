"""2.x import path: ``from pytorch_metric_learning.utils import common_functions as c_f``.

Only re-exports. ``LOGGER`` and ``LOGGER_NAME`` are looked up when read, so that after
``set_logger_name("name")`` they are the renamed logger and its name, as in 2.x; records of
the package's module loggers reach that logger's handlers too (see
:mod:`pytorch_metric_learning._logging`).
"""

from __future__ import annotations

import logging

from .._logging import legacy_logger, legacy_logger_name, set_logger_name
from ..testers.label_mapper import LabelMapper
from ._datasets import EmbeddingDataset, get_eval_dataloader
from ._label_helpers import (
    get_hierarchy_label,
    get_label_map,
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
    save_dict_of_models,
    save_model,
)
from ._tensor_helpers import (
    check_shapes,
    is_list_or_tuple,
    numpy_to_torch,
    to_device,
    to_dtype,
    to_numpy,
    torch_all_from_dim_to_end,
    torch_standard_scaler,
    use_cuda_if_available,
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
]

LOGGER: logging.Logger  # provided by __getattr__ below
LOGGER_NAME: str


def __getattr__(name: str) -> object:
    if name == "LOGGER":
        return legacy_logger()
    if name == "LOGGER_NAME":
        return legacy_logger_name()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
