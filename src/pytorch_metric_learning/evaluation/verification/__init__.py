"""Verification: is a pair a match? MatchFinder, threshold selection, operating points.

Thresholds over pair scores, TAR@FAR, EER and k-fold evaluation. Imports only
``distances`` and the package's shared helpers: nothing of search, retrieval or clustering.
"""

from __future__ import annotations

from .match_finder import MatchFinder
from .operating_points import (
    FoldEvaluation,
    KFoldEvaluation,
    ThresholdCurve,
    equal_error_rate,
    false_match_rate_at_recall,
    kfold_threshold_evaluation,
    recall_at_false_match_rate,
    threshold_curve,
)
from .thresholds import (
    MatchCounts,
    ThresholdSelection,
    match_accuracy,
    match_balanced_accuracy,
    match_f1,
    select_threshold,
)

__all__ = [
    "FoldEvaluation",
    "KFoldEvaluation",
    "MatchCounts",
    "MatchFinder",
    "ThresholdCurve",
    "ThresholdSelection",
    "equal_error_rate",
    "false_match_rate_at_recall",
    "kfold_threshold_evaluation",
    "match_accuracy",
    "match_balanced_accuracy",
    "match_f1",
    "recall_at_false_match_rate",
    "select_threshold",
    "threshold_curve",
]
