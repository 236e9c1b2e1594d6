"""Nearest-neighbour search, thresholds, clustering and accuracy of embeddings.

Importing this package imports neither faiss nor scikit-learn.
"""

from __future__ import annotations

from ._per_query import PerQueryValues
from ._plugin_proxy import FaissKMeans, FaissKNN
from .accuracy_calculator import AccuracyCalculator
from .bootstrap import (
    ConfidenceInterval,
    PairedComparison,
    bootstrap_interval,
    bootstrap_intervals,
    compare_per_query,
    paired_bootstrap,
)
from .kmeans import TorchKMeans
from .knn import CustomKNN, remove_self_matches
from .knn_output import check_knn_backend, check_knn_output
from .match_finder import MatchFinder
from .mutual_information import adjusted_mutual_info, normalized_mutual_info
from .protocols import KMeansFunc, KNNFunc, knn_is_inverted
from .registry import (
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
)
from .thresholds import (
    MatchCounts,
    ThresholdSelection,
    match_accuracy,
    match_balanced_accuracy,
    match_f1,
    select_threshold,
)
from .verification import (
    FoldEvaluation,
    KFoldEvaluation,
    ThresholdCurve,
    equal_error_rate,
    false_match_rate_at_recall,
    kfold_threshold_evaluation,
    recall_at_false_match_rate,
    threshold_curve,
)

__all__ = [
    "CustomKNN",
    "FaissKMeans",
    "FaissKNN",
    "KMeansFunc",
    "KNNFunc",
    "check_knn_backend",
    "check_knn_output",
    "knn_is_inverted",
    "remove_self_matches",
    "list_kmeans_backends",
    "list_knn_backends",
    "load_kmeans_func",
    "load_knn_func",
    "register_kmeans_backend",
    "register_knn_backend",
    "MatchFinder",
    "MatchCounts",
    "ThresholdSelection",
    "select_threshold",
    "match_accuracy",
    "match_balanced_accuracy",
    "match_f1",
    "ThresholdCurve",
    "FoldEvaluation",
    "KFoldEvaluation",
    "recall_at_false_match_rate",
    "false_match_rate_at_recall",
    "equal_error_rate",
    "threshold_curve",
    "kfold_threshold_evaluation",
    "AccuracyCalculator",
    "PerQueryValues",
    "ConfidenceInterval",
    "PairedComparison",
    "bootstrap_interval",
    "bootstrap_intervals",
    "paired_bootstrap",
    "compare_per_query",
    "TorchKMeans",
    "adjusted_mutual_info",
    "normalized_mutual_info",
]
