"""2.x import path: ``from pytorch_metric_learning.utils.accuracy_calculator import ...``.

Only re-exports; the helpers live in :mod:`pytorch_metric_learning.evaluation.retrieval._compat`.
"""

from __future__ import annotations

from ..evaluation.retrieval._compat import (
    EQUALITY,
    get_label_match_counts,
    get_lone_query_labels,
    get_relevance_mask,
    get_unique_labels,
    maybe_get_avg_of_avgs,
    mean_average_precision,
    mean_reciprocal_rank,
    nan_accuracy,
    precision_at_k,
    r_precision,
    try_getting_not_lone_labels,
)
from ..evaluation.retrieval.accuracy_calculator import AccuracyCalculator

__all__ = [
    "EQUALITY",
    "AccuracyCalculator",
    "get_label_match_counts",
    "get_lone_query_labels",
    "get_relevance_mask",
    "get_unique_labels",
    "maybe_get_avg_of_avgs",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "nan_accuracy",
    "precision_at_k",
    "r_precision",
    "try_getting_not_lone_labels",
]
