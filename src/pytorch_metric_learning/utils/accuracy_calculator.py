"""2.x import path: ``from pytorch_metric_learning.utils.accuracy_calculator import ...``."""

from __future__ import annotations

from ..evaluation._compat import maybe_get_avg_of_avgs, precision_at_k, try_getting_not_lone_labels
from ..evaluation.accuracy_calculator import EQUALITY, AccuracyCalculator

__all__ = [
    "EQUALITY",
    "AccuracyCalculator",
    "maybe_get_avg_of_avgs",
    "precision_at_k",
    "try_getting_not_lone_labels",
]
