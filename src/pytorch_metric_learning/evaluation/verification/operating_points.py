"""Verification operating points: TAR@FAR metrics, equal error rate, curves and k-fold.

These build on :mod:`pytorch_metric_learning.evaluation.verification.thresholds`: the same candidate
thresholds, the same counts, and the same MatchFinder rule for applying a threshold.
Recall is the true accept rate (TAR); the false match rate (FMR) is the false accept rate
(FAR): ``fp / (fp + tn)``.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np
import torch

from ..._validation import check_positive_int, invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from .thresholds import (
    MatchCounts,
    Metric,
    candidate_thresholds,
    check_is_inverted,
    check_metric,
    check_pairs,
    count_candidates,
    counts_at_threshold,
    evaluate_metric,
    select_threshold,
)

__all__ = [
    "ThresholdCurve",
    "FoldEvaluation",
    "KFoldEvaluation",
    "recall_at_false_match_rate",
    "false_match_rate_at_recall",
    "equal_error_rate",
    "threshold_curve",
    "kfold_threshold_evaluation",
]


class ThresholdCurve(NamedTuple):
    """Every candidate threshold with its counts, strictest first (for ROC and DET plots).

    ``thresholds`` is a float64 CPU tensor; ``counts[j]`` are the decisions of
    ``thresholds[j]`` under the MatchFinder rule.
    """

    thresholds: torch.Tensor
    counts: MatchCounts


class FoldEvaluation(NamedTuple):
    """One fold of :func:`kfold_threshold_evaluation`.

    ``threshold`` was chosen on the other folds, where the metric was ``train_value``;
    ``test_value`` and ``test_counts`` (one count each) are those of the held-out pairs
    ``test_indices`` at that threshold.
    """

    threshold: float
    train_value: float
    test_value: float
    test_counts: MatchCounts
    test_indices: torch.Tensor


class KFoldEvaluation(NamedTuple):
    """Mean and population standard deviation of the held-out values, and every fold."""

    mean: float
    std: float
    folds: tuple[FoldEvaluation, ...]


def _recall(counts: MatchCounts) -> torch.Tensor:
    return counts.true_positives / (counts.true_positives + counts.false_negatives)


def _false_match_rate(counts: MatchCounts) -> torch.Tensor:
    return counts.false_positives / (counts.false_positives + counts.true_negatives)


class _RecallAtFalseMatchRate:
    def __init__(self, rate: float) -> None:
        self.rate = _check_rate(rate, "rate", "recall_at_false_match_rate")

    def __repr__(self) -> str:
        return f"recall_at_false_match_rate({self.rate!r})"

    def __call__(self, counts: MatchCounts) -> torch.Tensor:
        allowed = _false_match_rate(counts) <= self.rate
        return torch.where(allowed, _recall(counts), torch.nan)


class _FalseMatchRateAtRecall:
    def __init__(self, recall: float) -> None:
        self.recall = _check_rate(recall, "recall", "false_match_rate_at_recall")

    def __repr__(self) -> str:
        return f"false_match_rate_at_recall({self.recall!r})"

    def __call__(self, counts: MatchCounts) -> torch.Tensor:
        reached = torch.nonzero(_recall(counts) >= self.recall)
        values = torch.full_like(counts.false_positives, torch.nan)
        if len(reached):
            first = reached[0, 0]
            values[first] = _false_match_rate(counts)[first]
        return values


def recall_at_false_match_rate(rate: float) -> Metric:
    """A metric: recall (TAR) where the false match rate is at most ``rate``, else NaN.

    With :func:`select_threshold` it finds the highest recall at a false match rate of at
    most ``rate`` (TAR@FAR), at the strictest threshold that reaches it.

    Example:
        >>> from pytorch_metric_learning.evaluation import select_threshold
        >>> scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
        >>> labels = torch.tensor([True, False, True, True, False])
        >>> metric = recall_at_false_match_rate(0.5)
        >>> select_threshold(scores, labels, metric, is_inverted=True).value
        1.0
    """
    return _RecallAtFalseMatchRate(rate)


def false_match_rate_at_recall(recall: float) -> Metric:
    """A metric: the false match rate at the strictest threshold whose recall reaches ``recall``.

    It is NaN at every other candidate, so :func:`select_threshold` returns that threshold
    and the lowest false match rate that keeps recall (TAR) at least ``recall``. On a
    single threshold's counts it is NaN where recall falls short.

    Example:
        >>> from pytorch_metric_learning.evaluation import select_threshold
        >>> scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
        >>> labels = torch.tensor([True, False, True, True, False])
        >>> metric = false_match_rate_at_recall(1.0)
        >>> select_threshold(scores, labels, metric, is_inverted=True)
        ThresholdSelection(threshold=0.550000011920929, value=0.5)
    """
    return _FalseMatchRateAtRecall(recall)


def _check_rate(value: Any, param: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(param, owner, "a number between 0 and 1", value, InvalidTypeError)
    if not 0 <= float(value) <= 1:
        raise invalid(param, owner, "a number between 0 and 1", value)
    return float(value)


@torch.no_grad()
def threshold_curve(scores: Any, labels: Any, *, is_inverted: bool) -> ThresholdCurve:
    """Every candidate threshold of :func:`select_threshold` and its counts, strictest first.

    The first threshold matches nothing (+inf for similarities, -inf for distances) and
    the last matches every pair. ROC points are ``(fp / (fp + tn), tp / (tp + fn))``.

    Example:
        >>> curve = threshold_curve(
        ...     torch.tensor([0.5, 2.0, 1.0]), torch.tensor([True, False, True]), is_inverted=False
        ... )
        >>> curve.thresholds.tolist(), curve.counts.true_positives.tolist()
        ([-inf, 0.75, 1.5, 2.0], [0.0, 1.0, 2.0, 2.0])
    """
    owner = "threshold_curve"
    check_is_inverted(is_inverted, owner)
    scores, labels = check_pairs(scores, labels, owner)
    distinct, counts = count_candidates(scores, labels, is_inverted)
    thresholds = candidate_thresholds(distinct, scores.dtype, is_inverted)
    return ThresholdCurve(torch.from_numpy(thresholds), counts)


@torch.no_grad()
def equal_error_rate(scores: Any, labels: Any, *, is_inverted: bool) -> float:
    """The rate at which false matches and false non-matches are equally frequent.

    The ROC curve is linear between candidate thresholds; the equal error rate is where it
    crosses ``false match rate == 1 - recall``.

    Example:
        >>> scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
        >>> labels = torch.tensor([True, False, True, False])
        >>> equal_error_rate(scores, labels, is_inverted=True)
        0.5
    """
    owner = "equal_error_rate"
    check_is_inverted(is_inverted, owner)
    scores, labels = check_pairs(scores, labels, owner)
    _, counts = count_candidates(scores, labels, is_inverted)
    false_match = _false_match_rate(counts)
    gap = false_match - (1 - _recall(counts))
    after = int(torch.nonzero(gap >= 0)[0, 0])  # gap runs from -1 up to +1
    if gap[after] == 0:
        return float(false_match[after])
    weight = -gap[after - 1] / (gap[after] - gap[after - 1])
    before = false_match[after - 1]
    return float(before + weight * (false_match[after] - before))


def kfold_threshold_evaluation(
    scores: Any,
    labels: Any,
    metric: Metric,
    *,
    is_inverted: bool,
    folds: int = 10,
    seed: int = 0,
) -> KFoldEvaluation:
    """LFW-style evaluation: choose the threshold on ``folds - 1`` folds, score the rest.

    Pairs are shuffled with ``seed`` and dealt to folds class by class, so every fold
    holds about the same share of matching pairs. For each fold, :func:`select_threshold`
    chooses on the other folds and ``metric`` scores the held-out pairs at that threshold.
    A metric with a constraint (such as :func:`recall_at_false_match_rate`) is NaN on a
    fold where the held-out pairs break it, and the mean is then NaN too.

    Args:
        scores, labels, metric, is_inverted: As for :func:`select_threshold`.
        folds: The number of folds, at least 2.
        seed: Seeds the shuffle.

    Example:
        >>> from pytorch_metric_learning.evaluation import match_accuracy
        >>> scores = torch.arange(8.0)
        >>> labels = scores < 4
        >>> result = kfold_threshold_evaluation(
        ...     scores, labels, match_accuracy, is_inverted=False, folds=2
        ... )
        >>> result.mean, result.std, [fold.threshold for fold in result.folds]
        (1.0, 0.0, [3.5, 3.5])
    """
    owner = "kfold_threshold_evaluation"
    check_metric(metric, owner)
    check_is_inverted(is_inverted, owner)
    scores, labels = check_pairs(scores, labels, owner)
    folds = _check_folds(folds, labels, owner)
    fold_of = _assign_folds(labels, folds, _check_seed(seed, owner))
    results = tuple(
        _evaluate_fold(scores, labels, fold_of == fold, metric, is_inverted, owner)
        for fold in range(folds)
    )
    values = np.array([result.test_value for result in results])
    return KFoldEvaluation(float(values.mean()), float(values.std()), results)


def _check_folds(folds: Any, labels: torch.Tensor, owner: str) -> int:
    folds = check_positive_int(folds, "folds", owner)
    positives = int(labels.sum())
    if folds < 2 or folds > len(labels):
        raise invalid(
            "folds", owner, f"an int from 2 to the number of pairs ({len(labels)})", folds
        )
    if min(positives, len(labels) - positives) < 2:
        raise InvalidArgumentError(
            f"The 'labels' parameter of {owner} must contain at least 2 True and 2 False, so "
            f"that every training split has both. Got {positives} True of {len(labels)} instead."
        )
    return folds


def _check_seed(seed: Any, owner: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise invalid("seed", owner, "a non-negative int", seed, InvalidTypeError)
    if seed < 0:
        raise invalid("seed", owner, "a non-negative int", seed)
    return int(seed)


def _assign_folds(labels: torch.Tensor, folds: int, seed: int) -> torch.Tensor:
    """Shuffle each class, then deal positives and then negatives round-robin to folds."""
    rng = np.random.default_rng(seed)
    labels_np = labels.numpy()
    positives = rng.permutation(np.flatnonzero(labels_np))
    negatives = rng.permutation(np.flatnonzero(~labels_np))
    fold_of = np.empty(len(labels_np), dtype=np.int64)
    fold_of[np.concatenate((positives, negatives))] = np.arange(len(labels_np)) % folds
    return torch.from_numpy(fold_of)


def _evaluate_fold(
    scores: torch.Tensor,
    labels: torch.Tensor,
    held_out: torch.Tensor,
    metric: Metric,
    is_inverted: bool,
    owner: str,
) -> FoldEvaluation:
    train = ~held_out
    selection = select_threshold(scores[train], labels[train], metric, is_inverted=is_inverted)
    counts = counts_at_threshold(
        scores[held_out], labels[held_out], selection.threshold, is_inverted
    )
    with torch.no_grad():
        test_value = float(evaluate_metric(metric, counts, owner)[0])
    indices = torch.nonzero(held_out)[:, 0]
    return FoldEvaluation(selection.threshold, selection.value, test_value, counts, indices)
