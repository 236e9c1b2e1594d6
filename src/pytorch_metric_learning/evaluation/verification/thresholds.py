"""Choosing a match/no-match threshold from labelled validation pairs.

A candidate threshold is one way to separate the scores sorted from the most alike to the
least alike: the pairs with the ``j`` most alike distinct scores match, the others do not.
Every count and every candidate threshold comes from one sort and cumulative sums, so
selection is ``O(n log n)`` in the number of pairs.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from ..._validation import check_plain_tensor, invalid
from ...errors import InvalidArgumentError

__all__ = [
    "MatchCounts",
    "ThresholdSelection",
    "select_threshold",
    "match_accuracy",
    "match_balanced_accuracy",
    "match_f1",
    "Metric",
    "check_pairs",
    "check_metric",
    "check_is_inverted",
    "count_candidates",
    "candidate_thresholds",
    "evaluate_metric",
    "best_candidate",
    "counts_at_threshold",
]

_SCORE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class MatchCounts(NamedTuple):
    """Confusion counts of match decisions, one per candidate threshold, strictest first.

    Each field is a one-dimensional float64 CPU tensor. A true positive is a pair that
    should match and does; a false positive (a false match) one that should not but does.
    """

    true_positives: torch.Tensor
    false_positives: torch.Tensor
    true_negatives: torch.Tensor
    false_negatives: torch.Tensor


class ThresholdSelection(NamedTuple):
    """The chosen threshold and the metric's value there."""

    threshold: float
    value: float


Metric = Callable[[MatchCounts], torch.Tensor]


def match_accuracy(counts: MatchCounts) -> torch.Tensor:
    """The fraction of correct decisions; it favours the majority class on imbalanced pairs.

    Example:
        >>> counts = MatchCounts(*torch.tensor([[3.0], [1.0], [4.0], [2.0]], dtype=torch.float64))
        >>> match_accuracy(counts).tolist()
        [0.7]
    """
    tp, fp, tn, fn = counts
    return (tp + tn) / (tp + fp + tn + fn)


def match_balanced_accuracy(counts: MatchCounts) -> torch.Tensor:
    """The mean of recall and specificity, NaN where a class is absent.

    Example:
        >>> counts = MatchCounts(*torch.tensor([[3.0], [1.0], [4.0], [2.0]], dtype=torch.float64))
        >>> match_balanced_accuracy(counts).tolist()
        [0.7]
    """
    tp, fp, tn, fn = counts
    return (tp / (tp + fn) + tn / (tn + fp)) / 2


def match_f1(counts: MatchCounts) -> torch.Tensor:
    """``2 * tp / (2 * tp + fp + fn)``, NaN where nothing should match and nothing does.

    Example:
        >>> counts = MatchCounts(*torch.tensor([[3.0], [1.0], [4.0], [2.0]], dtype=torch.float64))
        >>> match_f1(counts).tolist()
        [0.6666666666666666]
    """
    tp, fp, _, fn = counts
    return 2 * tp / (2 * tp + fp + fn)


@torch.no_grad()
def select_threshold(
    scores: Any,
    labels: Any,
    metric: Metric,
    *,
    is_inverted: bool,
) -> ThresholdSelection:
    """Choose the match threshold that maximizes ``metric`` on validation pairs.

    Args:
        scores: A 1-D floating-point tensor or NumPy array of finite distances or
            similarities, one per validation pair.
        labels: A boolean tensor or array of the same length, True where the pair should
            match. Both values must be present.
        metric: Receives a :class:`MatchCounts` and returns one value per candidate,
            NaN where undefined.
        is_inverted: True when larger scores mean more alike; pass ``distance.is_inverted``.

    Returns:
        The threshold, which :class:`MatchFinder` applies as ``distance <= threshold``
        (``similarity >= threshold`` when inverted) to reproduce exactly the decisions
        counted in ``value``. Among tied candidates, the one with the fewest matches wins.

    Raises:
        ValueError: For invalid inputs, a metric output of another shape, or a metric that
            is NaN for every candidate.

    Example:
        >>> scores = torch.tensor([0.9, 0.8, 0.3, 0.1])
        >>> labels = torch.tensor([True, True, False, False])
        >>> select_threshold(scores, labels, match_accuracy, is_inverted=True)
        ThresholdSelection(threshold=0.550000011920929, value=1.0)
    """
    owner = "select_threshold"
    check_metric(metric, owner)
    check_is_inverted(is_inverted, owner)
    scores, labels = check_pairs(scores, labels, owner)
    distinct, counts = count_candidates(scores, labels, is_inverted)
    values = evaluate_metric(metric, counts, owner)
    index = best_candidate(values, owner)
    neighbours = distinct[max(index - 1, 0) : index + 1]
    thresholds = candidate_thresholds(neighbours, scores.dtype, is_inverted)
    return ThresholdSelection(float(thresholds[min(index, 1)]), float(values[index]))


def check_metric(metric: Any, owner: str) -> None:
    """Raise ``ValueError`` unless ``metric`` is callable."""
    if not callable(metric):
        raise invalid("metric", owner, "a callable taking MatchCounts", metric)


def check_is_inverted(is_inverted: Any, owner: str) -> None:
    """Raise ``ValueError`` unless ``is_inverted`` is a bool."""
    if not isinstance(is_inverted, (bool, np.bool_)):
        raise invalid("is_inverted", owner, "a bool (pass distance.is_inverted)", is_inverted)


def check_pairs(scores: Any, labels: Any, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate validation pairs; return detached CPU tensors (scores keep their dtype)."""
    scores = _as_cpu_tensor(scores, "scores", owner, "f")
    labels = _as_cpu_tensor(labels, "labels", owner, "b")
    if scores.ndim != 1:
        raise invalid("scores", owner, "one-dimensional", f"shape {tuple(scores.shape)}")
    if scores.dtype not in _SCORE_DTYPES:
        raise invalid("scores", owner, "float16, bfloat16, float32 or float64", scores.dtype)
    if labels.dtype != torch.bool:
        raise invalid("labels", owner, "boolean (compare integer labels with == 1)", labels.dtype)
    if labels.shape != scores.shape:
        raise invalid("labels", owner, f"shaped {tuple(scores.shape)} like scores", labels.shape)
    if not np.isfinite(_as_numpy(scores)).all():
        raise InvalidArgumentError(
            f"The 'scores' parameter of {owner} contains NaN or infinite values; "
            "scores must be finite distances or similarities."
        )
    positives = int(np.count_nonzero(labels.numpy()))
    if positives in (0, len(labels)):
        raise InvalidArgumentError(
            f"The 'labels' parameter of {owner} must contain both True and False. "
            f"Got {positives} True of {len(labels)} instead."
        )
    return scores, labels


def _as_cpu_tensor(value: Any, param: str, owner: str, kind: str) -> torch.Tensor:
    """``value`` as a detached CPU tensor; NumPy arrays must have the dtype ``kind``."""
    if isinstance(value, torch.Tensor):
        if not value.is_complex():  # complex scores: a ValueError from the dtype check
            check_plain_tensor(value, param, owner)  # meta and sparse: before .cpu()
        return value.detach().cpu()
    expected = "a floating-point" if kind == "f" else "a boolean"
    if not isinstance(value, np.ndarray):
        raise invalid(
            param, owner, f"{expected} torch.Tensor or numpy.ndarray", type(value).__name__
        )
    if value.dtype.kind != kind or value.dtype.itemsize > 8:
        raise invalid(param, owner, f"{expected} array", value.dtype)
    array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
    if not array.flags.writeable:
        array = array.copy()  # torch.from_numpy warns about read-only arrays
    return torch.from_numpy(array)


def _as_numpy(scores: torch.Tensor) -> np.ndarray:
    """A NumPy view of CPU scores (a float32 copy for bfloat16, which NumPy lacks)."""
    return (scores.float() if scores.dtype == torch.bfloat16 else scores).numpy()


def count_candidates(
    scores: torch.Tensor, labels: torch.Tensor, is_inverted: bool
) -> tuple[np.ndarray, MatchCounts]:
    """Count decisions at every candidate threshold.

    Returns:
        The distinct scores, most alike first, as float64 (exact for every accepted dtype),
        and the :class:`MatchCounts` of the ``len(distinct) + 1`` candidates, strictest
        first: candidate ``j`` matches the pairs with the ``j`` most alike distinct scores.
    """
    labels_np = labels.numpy()
    if scores.dtype == torch.float64:
        ordered, ordered_labels = _sort_by_class(scores.numpy(), labels_np, is_inverted)
        ends = _group_ends(ordered)
        distinct = -ordered[ends] if is_inverted else ordered[ends]
    else:
        values = _as_numpy(scores).astype(np.float32, copy=False)
        keys, ordered_labels = _sort_packed(values, labels_np, is_inverted)
        ends = _group_ends(keys)
        distinct = _decode_keys(keys[ends], is_inverted)
    positives = np.cumsum(ordered_labels, dtype=np.int64)[ends]
    return distinct, _counts(positives, ends + 1, int(positives[-1]), len(labels_np))


def _sort_by_class(
    values: np.ndarray, labels: np.ndarray, is_inverted: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Sort scores most alike first, with their labels, for scores too wide to pack.

    Each class is sorted on its own and the two runs are merged by binary search, which
    costs less than an argsort and the gathers it needs. Returned scores are negated when
    ``is_inverted``, so that ascending order is most alike first.
    """
    keys = -values if is_inverted else values
    positives, negatives = np.sort(keys[labels]), np.sort(keys[~labels])
    at_positives = np.searchsorted(negatives, positives, "left")
    at_positives += np.arange(len(positives))
    at_negatives = np.searchsorted(positives, negatives, "right")
    at_negatives += np.arange(len(negatives))
    ordered = np.empty_like(keys)
    ordered[at_positives], ordered[at_negatives] = positives, negatives
    ordered_labels = np.zeros(len(keys), dtype=np.bool_)
    ordered_labels[at_positives] = True
    return ordered, ordered_labels


def _sort_packed(
    values: np.ndarray, labels: np.ndarray, is_inverted: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Sort float32 scores with their labels packed in the lowest bit of one uint64 key.

    The key of a score is its bit pattern mapped so that unsigned order is numeric order
    (flipped when larger scores are more alike); -0.0 is first folded onto +0.0.
    """
    bits = (values + np.float32(0.0)).view(np.int32)
    flip = bits >> 31  # all ones for negative scores, whose order the bit pattern reverses
    flip |= np.int32(-(2**31))
    flip ^= bits
    key = flip.view(np.uint32)
    if is_inverted:
        np.invert(key, out=key)
    packed = key.astype(np.uint64)
    packed <<= np.uint64(1)
    packed |= labels
    packed.sort()
    ordered_labels = np.bitwise_and(packed, np.uint8(1), dtype=np.uint8).view(np.bool_)
    packed >>= np.uint64(1)
    return packed, ordered_labels


def _decode_keys(keys: np.ndarray, is_inverted: bool) -> np.ndarray:
    key = keys.astype(np.uint32)
    if is_inverted:
        key = ~key
    bits = np.where(key >> 31, key & np.uint32(0x7FFFFFFF), ~key)
    return bits.view(np.float32).astype(np.float64)


def _group_ends(ordered: np.ndarray) -> np.ndarray:
    """Positions of the last element of each run of equal values."""
    ends = np.flatnonzero(ordered[1:] != ordered[:-1])
    return np.append(ends, len(ordered) - 1)


def _counts(
    positives: np.ndarray, matched: np.ndarray, num_positives: int, num_pairs: int
) -> MatchCounts:
    tp = np.concatenate(([0], positives)).astype(np.float64)
    fp = np.concatenate(([0], matched - positives)).astype(np.float64)
    num_negatives = num_pairs - num_positives
    return MatchCounts(
        torch.from_numpy(tp),
        torch.from_numpy(fp),
        torch.from_numpy(num_negatives - fp),
        torch.from_numpy(num_positives - tp),
    )


def candidate_thresholds(distinct: np.ndarray, dtype: torch.dtype, is_inverted: bool) -> np.ndarray:
    """The ``len(distinct) + 1`` candidate thresholds for ``distinct`` scores, strictest first.

    Args:
        distinct: Distinct scores, most alike first, as float64.
        dtype: The scores' own dtype, in which :class:`MatchFinder` compares them.
        is_inverted: True when larger scores mean more alike.

    Returns:
        float64 thresholds: +inf (similarities) or -inf (distances) to match nothing;
        between neighbours their midpoint, or the matching side's weaker score when the
        midpoint is not strictly between them in ``dtype``; the weakest score to match all.
    """
    out = np.empty(len(distinct) + 1, dtype=np.float64)
    out[0] = np.inf if is_inverted else -np.inf
    out[1:] = distinct
    stronger, weaker = distinct[:-1], distinct[1:]
    with np.errstate(over="ignore"):
        mid = (stronger + weaker) / 2
    overflowed = ~np.isfinite(mid)
    mid[overflowed] = stronger[overflowed] / 2 + weaker[overflowed] / 2
    between = np.ones(len(mid), dtype=np.bool_)
    for rounded in _roundings(mid, dtype):
        between &= (rounded != stronger) & (rounded != weaker)
    out[1:-1] = np.where(between, mid, stronger)
    return out


def _roundings(mid: np.ndarray, dtype: torch.dtype) -> list[np.ndarray]:
    """``mid`` as every comparison path may round it: itself, and cast to the scores' dtype.

    PyTorch and NumPy cast a Python float to the tensor's dtype before comparing; half
    dtypes may go through float32 first, so both paths are checked.
    """
    rounded = [mid]
    if dtype == torch.float64:
        return rounded
    via_float32 = mid.astype(np.float32)
    rounded.append(via_float32.astype(np.float64))
    if dtype != torch.float32:
        rounded.append(torch.from_numpy(mid).to(dtype).double().numpy())
        rounded.append(torch.from_numpy(via_float32).to(dtype).double().numpy())
    return rounded


def evaluate_metric(metric: Metric, counts: MatchCounts, owner: str) -> torch.Tensor:
    """Call ``metric`` and check it returned one value per candidate; return float64 CPU."""
    expected = tuple(counts.true_positives.shape)
    result = metric(counts)
    try:
        values = torch.as_tensor(result).detach()
    except (TypeError, ValueError, RuntimeError) as error:
        raise invalid("metric", owner, "a callable returning a tensor", metric) from error
    if values.is_complex():
        raise invalid("metric", owner, "a callable returning real values", metric)
    if tuple(values.shape) != expected:
        raise InvalidArgumentError(
            f"The 'metric' parameter of {owner} must return one value per candidate "
            f"threshold, shaped {expected}. Got shape {tuple(values.shape)} instead."
        )
    return values.to(device="cpu", dtype=torch.float64)


def best_candidate(values: torch.Tensor, owner: str) -> int:
    """The index of the largest non-NaN value; ties go to the fewest matches (lowest index)."""
    array = values.numpy()
    if np.isnan(array).all():
        raise InvalidArgumentError(
            f"The 'metric' parameter of {owner} returned NaN for every candidate threshold; "
            "no threshold satisfies it on these validation pairs."
        )
    return int(np.argmax(array == np.nanmax(array)))


def counts_at_threshold(
    scores: torch.Tensor, labels: torch.Tensor, threshold: float, is_inverted: bool
) -> MatchCounts:
    """The :class:`MatchCounts` (one count each) of applying the MatchFinder rule to pairs."""
    if not isinstance(threshold, numbers.Real):
        raise invalid("threshold", "counts_at_threshold", "a real number", threshold)
    matched = scores >= threshold if is_inverted else scores <= threshold
    tp = int((matched & labels).sum())
    fp = int(matched.sum()) - tp
    positives = int(labels.sum())
    negatives = len(labels) - positives
    values = [tp, fp, negatives - fp, positives - tp]
    return MatchCounts(*(torch.tensor([v], dtype=torch.float64) for v in values))
