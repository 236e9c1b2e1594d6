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
from tqdm import tqdm

from .._logging import legacy_logger, legacy_logger_name, set_logger_name
from ..distances._records import (
    add_to_recordable_attributes,
    list_of_recordable_attributes_list_names,
    reset_stats,
)
from ..testers.label_mapper import LabelMapper
from . import _label_helpers, _model_files, _tensor_helpers, _training_helpers
from ._datasets import EmbeddingDataset, get_eval_dataloader
from ._label_helpers import *  # noqa: F403
from ._model_files import *  # noqa: F403
from ._record_rows import sqlite_obj_to_dict
from ._tensor_helpers import *  # noqa: F403
from ._training_helpers import *  # noqa: F403

__all__ = [
    "LOGGER",
    "LOGGER_NAME",
    "set_logger_name",
    "EmbeddingDataset",
    "LabelMapper",
    "get_eval_dataloader",
    "sqlite_obj_to_dict",
    "COLLECT_STATS",
    "NUMPY_RANDOM",
    "safe_random_choice",
    "add_to_recordable_attributes",
    "reset_stats",
    "list_of_recordable_attributes_list_names",
    "tqdm",
    *_label_helpers.__all__,
    *_model_files.__all__,
    *_tensor_helpers.__all__,
    *_training_helpers.__all__,
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
