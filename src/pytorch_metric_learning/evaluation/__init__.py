"""Nearest-neighbour search, thresholds, clustering and accuracy of embeddings.

The package is four rooms, each importing only those below it: ``search`` (the k-NN
contract, registry and CustomKNN), ``clustering`` (k-means, mutual information),
``verification`` (MatchFinder, thresholds, operating points) and ``retrieval``
(AccuracyCalculator, metrics, bootstrap); ``distributed`` runs them over a process group.
Importing this package imports neither faiss nor scikit-learn.
"""

from __future__ import annotations

from .clustering import TorchKMeans, adjusted_mutual_info, normalized_mutual_info
from .retrieval import (
    AccuracyCalculator,
    ConfidenceInterval,
    PairedComparison,
    PerQueryValues,
    bootstrap_interval,
    bootstrap_intervals,
    compare_per_query,
    paired_bootstrap,
)
from .search import (
    CustomKNN,
    FaissKMeans,
    FaissKNN,
    KMeansFunc,
    KNNFunc,
    check_knn_backend,
    check_knn_output,
    knn_is_inverted,
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
    remove_self_matches,
)
from .verification import (
    FoldEvaluation,
    KFoldEvaluation,
    MatchCounts,
    MatchFinder,
    ThresholdCurve,
    ThresholdSelection,
    equal_error_rate,
    false_match_rate_at_recall,
    kfold_threshold_evaluation,
    match_accuracy,
    match_balanced_accuracy,
    match_f1,
    recall_at_false_match_rate,
    select_threshold,
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
