"""The module-level metric helpers of pytorch-metric-learning 2.x, with their signatures.

2.x users wrote metrics such as::

    def calculate_precision_at_5(self, knn_labels, query_labels, **kwargs):
        return accuracy_calculator.precision_at_k(
            knn_labels, query_labels[:, None], 5, self.avg_of_avgs,
            self.return_per_class, self.label_comparison_fn)

and fed the helpers hand-made ``knn_labels`` and ``label_counts`` in their tests. These
functions keep those call shapes and return types (Python floats, or lists of floats per
label) as thin adapters over :mod:`.metrics` and :mod:`._label_stats`: no loop over labels
or queries. ``utils.accuracy_calculator`` re-exports them.

Conventions of 2.x kept here: ``gt_labels`` is ``query_labels[:, None]``;
``label_counts`` is ``(unique query labels, reference matches of each)``; a query whose
label is missing from ``label_counts`` has no relevant reference and a NaN value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

import torch

from . import metrics
from ._label_stats import LabelComparison, label_stats

__all__ = [
    "EQUALITY",
    "get_unique_labels",
    "maybe_get_avg_of_avgs",
    "get_relevance_mask",
    "r_precision",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "precision_at_k",
    "get_label_match_counts",
    "get_lone_query_labels",
    "try_getting_not_lone_labels",
    "nan_accuracy",
    "legacy_knn_metric",
]

EQUALITY = torch.eq


def get_unique_labels(labels: torch.Tensor) -> torch.Tensor:
    """The distinct labels (rows, for multi-dimensional labels), sorted.

    Example:
        >>> get_unique_labels(torch.tensor([[1, 2], [0, 5], [1, 2]])).tolist()
        [[0, 5], [1, 2]]
    """
    return torch.unique(labels, dim=0)


def maybe_get_avg_of_avgs(
    accuracy_per_sample: torch.Tensor,
    sample_labels: torch.Tensor,
    avg_of_avgs: bool,
    return_per_class: bool = False,
) -> Any:
    """Average per sample, per label then over labels, or per label (ordered by label).

    Example:
        >>> values = torch.tensor([1.0, 0.0, 1.0])
        >>> maybe_get_avg_of_avgs(values, torch.tensor([[0], [0], [1]]), avg_of_avgs=True)
        0.75
    """
    values = accuracy_per_sample.to(torch.float64)
    if not (avg_of_avgs or return_per_class):
        return metrics.average(values)
    rows = sample_labels.reshape(len(sample_labels), -1)
    classes, class_ids = torch.unique(rows, dim=0, return_inverse=True)
    per_class = metrics.average_per_class(values, class_ids, len(classes))
    return per_class.tolist() if return_per_class else metrics.average(per_class)


def get_relevance_mask(
    shape: Sequence[int],
    gt_labels: torch.Tensor,
    ref_includes_query: bool,
    label_counts: tuple[Any, Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the first ``shape[1]`` neighbours could be relevant, and ``R`` per query.

    Row ``q`` of the mask is true in its first ``R`` columns, where ``R`` is the count of
    the query's label in ``label_counts``, less one when the reference includes the query.

    Example:
        >>> counts = (torch.tensor([0, 1]), torch.tensor([3, 1]))
        >>> mask, r = get_relevance_mask((2, 3), torch.tensor([[0], [1]]), True, counts)
        >>> mask.tolist(), r.tolist()
        ([[True, True, False], [False, False, False]], [2, 0])
    """
    unique_labels, counts = _label_count_tensors(label_counts, gt_labels.device)
    position = _positions_in(_rows(gt_labels), _rows(unique_labels))
    found = position >= 0
    count = counts[position.clamp(min=0)] - int(ref_includes_query) if len(counts) else position
    count_per_query = torch.where(found, count, torch.zeros_like(position)).clamp(min=0)
    columns = torch.arange(int(shape[1]), device=gt_labels.device)
    return columns.unsqueeze(0) < count_per_query.unsqueeze(1), count_per_query


def r_precision(
    knn_labels: torch.Tensor, gt_labels: torch.Tensor, ref_includes_query: bool,
    label_counts: tuple[Any, Any], avg_of_avgs: bool = False, return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Any:  # fmt: skip
    """R-precision of each query, averaged as 2.x did.

    Example:
        >>> counts = (torch.tensor([0, 1]), torch.tensor([2, 2]))
        >>> knn_labels = torch.tensor([[0, 0], [0, 1]])
        >>> r_precision(knn_labels, torch.tensor([[0], [1]]), False, counts, False, False)
        0.75
    """
    relevance = _same_label(label_comparison_fn, gt_labels, knn_labels)
    _, num_relevant = get_relevance_mask(
        relevance.shape, gt_labels, ref_includes_query, label_counts
    )
    values = _per_query(metrics.r_precision, relevance, num_relevant)
    return maybe_get_avg_of_avgs(values, gt_labels, avg_of_avgs, return_per_class)


def mean_average_precision(
    knn_labels: torch.Tensor, gt_labels: torch.Tensor, ref_includes_query: bool,
    label_counts: tuple[Any, Any], avg_of_avgs: bool = False, return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
    at_r: bool = False,
) -> Any:  # fmt: skip
    """MAP over all ``k`` neighbours, or MAP@R with ``at_r=True``, averaged as 2.x did.

    Example:
        >>> counts = (torch.tensor([0]), torch.tensor([2]))
        >>> knn_labels = torch.tensor([[0, 1, 0]])
        >>> mean_average_precision(knn_labels, torch.tensor([[0]]), False, counts, False, False)
        0.8333333333333333
        >>> mean_average_precision(
        ...     knn_labels, torch.tensor([[0]]), False, counts, False, False, at_r=True
        ... )
        0.5
    """
    relevance = _same_label(label_comparison_fn, gt_labels, knn_labels)
    _, num_relevant = get_relevance_mask(
        relevance.shape, gt_labels, ref_includes_query, label_counts
    )
    metric = metrics.mean_average_precision_at_r if at_r else metrics.mean_average_precision
    values = _per_query(metric, relevance, num_relevant)
    return maybe_get_avg_of_avgs(values, gt_labels, avg_of_avgs, return_per_class)


def mean_reciprocal_rank(
    knn_labels: torch.Tensor,
    gt_labels: torch.Tensor,
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Any:
    """``1 / rank`` of each query's first matching neighbour (0 without one), averaged.

    Example:
        >>> knn_labels = torch.tensor([[1, 0], [0, 0]])
        >>> mean_reciprocal_rank(knn_labels, torch.tensor([[0], [1]]), False, False)
        0.25
    """
    relevance = _same_label(label_comparison_fn, gt_labels, knn_labels)
    values = metrics.mean_reciprocal_rank(relevance)
    return maybe_get_avg_of_avgs(values, gt_labels, avg_of_avgs, return_per_class)


def precision_at_k(
    knn_labels: torch.Tensor,
    gt_labels: torch.Tensor,
    k: int,
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Any:
    """Fraction of the first ``k`` neighbours whose label matches, averaged as in 2.x.

    ``gt_labels`` is ``query_labels[:, None]``, as 2.x code passes it. The averaging
    options default to a plain average, so the call in 2.x's documentation,
    ``precision_at_k(knn_labels, query_labels[:, None], 2)``, works as written.

    Example:
        >>> knn_labels = torch.tensor([[0, 1], [1, 1]])
        >>> precision_at_k(knn_labels, torch.tensor([[0], [1]]), 2, False, False)
        0.75
    """
    same = _same_label(label_comparison_fn, gt_labels, knn_labels[:, :k])
    values = same.sum(dim=1).to(torch.float64) / k
    return maybe_get_avg_of_avgs(values, gt_labels, avg_of_avgs, return_per_class)


def get_label_match_counts(
    query_labels: torch.Tensor,
    reference_labels: torch.Tensor,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique query labels, number of reference labels matching each)``.

    Example:
        >>> get_label_match_counts(torch.tensor([2, 0, 2]), torch.tensor([0, 2, 2, 2, 5]))
        (tensor([0, 2]), tensor([1, 3]))
    """
    comparison = None if label_comparison_fn is EQUALITY else label_comparison_fn
    stats = label_stats(query_labels, reference_labels, False, comparison)
    return stats.unique_query_labels, stats.match_counts


def get_lone_query_labels(
    query_labels: torch.Tensor,
    label_counts: tuple[Any, Any],
    ref_includes_query: bool,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels without a relevant reference, and a mask of the queries that have one.

    With ``ref_includes_query`` a label's own query does not count, when
    ``label_comparison_fn`` says the label matches itself.

    Example:
        >>> counts = get_label_match_counts(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 1]))
        >>> get_lone_query_labels(torch.tensor([0, 1, 1]), counts, True)
        (tensor([0]), tensor([False,  True,  True]))
    """
    unique_labels, match_counts = _label_count_tensors(label_counts, query_labels.device)
    if ref_includes_query:
        itself = _reduce_label_dims(label_comparison_fn(unique_labels, unique_labels))
        lone = match_counts - itself.long() <= 0
    else:
        lone = match_counts == 0
    lone_query_labels = unique_labels[lone]
    not_lone_query_mask = _positions_in(_rows(query_labels), _rows(lone_query_labels)) < 0
    return lone_query_labels, not_lone_query_mask


def try_getting_not_lone_labels(
    knn_labels: torch.Tensor, query_labels: torch.Tensor, not_lone_query_mask: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows of non-lone queries, or ``(None, None)`` when every query is lone.

    Example:
        >>> mask = torch.tensor([True, False])
        >>> try_getting_not_lone_labels(torch.tensor([[1], [2]]), torch.tensor([1, 3]), mask)
        (tensor([[1]]), tensor([1]))
    """
    mask = torch.as_tensor(not_lone_query_mask, dtype=torch.bool)
    if not bool(mask.any()):
        return None, None
    mask = mask.to(knn_labels.device)
    return knn_labels[mask], query_labels[mask]


def nan_accuracy(unique_labels: Sequence[Any], return_per_class: bool) -> Any:
    """The value of a k-NN metric when every query is lone: NaN, or one NaN per label.

    Example:
        >>> nan_accuracy(torch.tensor([3, 4]), return_per_class=True)
        [nan, nan]
    """
    if return_per_class:
        return [math.nan] * len(unique_labels)
    return math.nan


def legacy_knn_metric(
    name: str,
    knn_labels: torch.Tensor,
    query_labels: torch.Tensor,
    not_lone_query_mask: torch.Tensor | None,
    label_counts: tuple[Any, Any],
    ref_includes_query: bool,
    options: tuple[bool, bool, LabelComparison],
) -> Any:
    """A built-in k-NN metric from the keyword arguments 2.x passed to ``calculate_<name>``.

    ``options`` is ``(avg_of_avgs, return_per_class, label_comparison_fn)``. Used when a
    2.x caller hands ``AccuracyCalculator._get_accuracy`` its own ``knn_labels``.
    """
    avg_of_avgs, return_per_class, fn = options
    if not_lone_query_mask is None:
        not_lone_query_mask = torch.ones(len(query_labels), dtype=torch.bool)
    knn_labels, query_labels = try_getting_not_lone_labels(  # type: ignore[assignment]
        knn_labels, query_labels, not_lone_query_mask
    )
    if knn_labels is None:
        return nan_accuracy(label_counts[0], return_per_class)
    gt_labels = query_labels[:, None]
    if name == "precision_at_1":
        return precision_at_k(knn_labels, gt_labels, 1, avg_of_avgs, return_per_class, fn)
    if name == "mean_reciprocal_rank":
        return mean_reciprocal_rank(knn_labels, gt_labels, avg_of_avgs, return_per_class, fn)
    args = (knn_labels, gt_labels, ref_includes_query, label_counts, avg_of_avgs)
    if name == "r_precision":
        return r_precision(*args, return_per_class, fn)
    at_r = name == "mean_average_precision_at_r"
    return mean_average_precision(*args, return_per_class, fn, at_r=at_r)


def _same_label(
    fn: LabelComparison, gt_labels: torch.Tensor, knn_labels: torch.Tensor
) -> torch.Tensor:
    """Boolean ``(num_queries, k)``: whether each neighbour's label matches its query's."""
    return _reduce_label_dims(fn(gt_labels, knn_labels), keep=2)


def _reduce_label_dims(same: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """Multi-dimensional labels compared elementwise match when every element matches."""
    same = torch.as_tensor(same)
    if same.ndim > keep:
        same = same.reshape(*same.shape[:keep], -1).all(dim=keep)
    return same.bool()


def _rows(labels: torch.Tensor) -> torch.Tensor:
    """Labels as rows: ``(n,)``, ``(n, 1)`` and ``(n, 1, d)`` become ``(n, 1)``/``(n, d)``."""
    return labels.reshape(len(labels), int(labels[0].numel()) if len(labels) else 1)


def _positions_in(rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """For each row, the index of the last equal row of ``table``, or -1."""
    if len(table) == 0 or len(rows) == 0:
        return torch.full((len(rows),), -1, dtype=torch.long, device=rows.device)
    dtype = torch.promote_types(rows.dtype, table.dtype)
    both = torch.cat([table.to(dtype), rows.to(device=table.device, dtype=dtype)])
    joint, keys = torch.unique(both, dim=0, return_inverse=True)
    last = torch.full((len(joint),), -1, dtype=torch.long, device=keys.device)
    order = torch.arange(len(table), device=keys.device)
    last.scatter_reduce_(0, keys[: len(table)], order, reduce="amax")
    return last[keys[len(table) :]].to(rows.device)


def _label_count_tensors(
    label_counts: tuple[Any, Any], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``label_counts`` (tensors, arrays or lists, as 2.x tests wrote them) as tensors."""
    unique_labels, counts = label_counts
    return torch.as_tensor(unique_labels, device=device), torch.as_tensor(counts, device=device)


def _per_query(
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    relevance: torch.Tensor,
    num_relevant: torch.Tensor,
) -> torch.Tensor:
    """Per-query values; NaN for queries without a relevant reference (as 2.x's 0/0)."""
    values = torch.full((len(relevance),), math.nan, dtype=torch.float64, device=relevance.device)
    has_relevant = num_relevant > 0
    if bool(has_relevant.any()) and relevance.shape[1] > 0:
        values[has_relevant] = metric(relevance[has_relevant], num_relevant[has_relevant])
    return values
