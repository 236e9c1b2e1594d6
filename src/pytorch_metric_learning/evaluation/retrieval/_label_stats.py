"""Per-query label statistics for AccuracyCalculator, vectorized on the labels' device.

For plain equality of labels everything comes from one ``torch.unique`` over the query
and reference labels together, then ``bincount``: no loop over classes or queries and no
classes-by-samples mask. A custom comparison function can only be evaluated pairwise, so
its counts are taken in blocks of unique query labels against all reference labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...errors import InvalidArgumentError

__all__ = ["LabelStats", "label_stats", "relevance_of"]

LabelComparison = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Elements of one (unique query labels, references) block of a custom comparison.
_COMPARE_BLOCK = 1 << 24


@dataclass
class LabelStats:
    """What the k-NN metrics need to know about the labels, one entry per query.

    Attributes:
        unique_query_labels: The distinct query labels (rows, for 2-D labels), sorted.
        query_class: Each query's index into ``unique_query_labels``.
        match_counts: Reference labels matching each unique query label (the query
            itself included when the reference includes the query).
        num_relevant: ``R`` per query: matching references, not counting the query itself.
        query_keys, reference_keys: For plain equality, ids in one label space shared by
            query and reference (``None`` with a custom comparison).
    """

    unique_query_labels: torch.Tensor
    query_class: torch.Tensor
    match_counts: torch.Tensor
    num_relevant: torch.Tensor
    query_keys: torch.Tensor | None = None
    reference_keys: torch.Tensor | None = None

    @property
    def not_lone(self) -> torch.Tensor:
        """Queries with at least one relevant reference."""
        return self.num_relevant > 0

    @property
    def num_classes(self) -> int:
        return len(self.unique_query_labels)

    @property
    def max_bin_count(self) -> int:
        """The largest ``R`` of any query: the neighbours R-precision and MAP@R need."""
        return int(self.num_relevant.max()) if self.num_relevant.numel() else 0


def label_stats(
    query_labels: torch.Tensor,
    reference_labels: torch.Tensor,
    ref_includes_query: bool,
    comparison: LabelComparison | None = None,
) -> LabelStats:
    """Count, for every query, the references that share its label.

    ``comparison=None`` compares labels (rows of 2-D labels) for equality. Otherwise
    ``comparison(a, b)`` broadcasts over the leading dimensions of ``a`` and ``b`` and
    returns a boolean tensor; with ``ref_includes_query`` the query itself is subtracted
    from ``R`` only when ``comparison`` says its label matches itself.
    """
    if comparison is None:
        return _equality_stats(query_labels, reference_labels, ref_includes_query)
    return _custom_stats(query_labels, reference_labels, ref_includes_query, comparison)


def relevance_of(
    stats: LabelStats,
    indices: torch.Tensor,
    query_labels: torch.Tensor,
    knn_labels: torch.Tensor | None,
    comparison: LabelComparison | None = None,
) -> torch.Tensor:
    """Boolean ``(num_queries, k)``: whether each retrieved neighbour matches its query."""
    if comparison is None:
        assert stats.query_keys is not None and stats.reference_keys is not None
        return stats.reference_keys[indices] == stats.query_keys.unsqueeze(1)
    assert knn_labels is not None
    return _compare(comparison, query_labels.unsqueeze(1), knn_labels, tuple(indices.shape))


def _unique(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted distinct labels (rows of multi-dimensional labels) and each one's index."""
    dim = 0 if labels.ndim > 1 else None
    unique, inverse = torch.unique(labels, sorted=True, return_inverse=True, dim=dim)
    return unique, inverse


def _equality_stats(
    query_labels: torch.Tensor, reference_labels: torch.Tensor, ref_includes_query: bool
) -> LabelStats:
    num_queries = len(query_labels)
    joint, keys = _unique(torch.cat([query_labels, reference_labels]))
    query_keys, reference_keys = keys[:num_queries], keys[num_queries:]
    reference_counts = torch.bincount(reference_keys, minlength=len(joint))
    class_keys, query_class = torch.unique(query_keys, sorted=True, return_inverse=True)
    match_counts = reference_counts[class_keys]
    num_relevant = match_counts[query_class] - int(ref_includes_query)
    return LabelStats(
        unique_query_labels=joint[class_keys],
        query_class=query_class,
        match_counts=match_counts,
        num_relevant=num_relevant,
        query_keys=query_keys,
        reference_keys=reference_keys,
    )


def _custom_stats(
    query_labels: torch.Tensor,
    reference_labels: torch.Tensor,
    ref_includes_query: bool,
    comparison: LabelComparison,
) -> LabelStats:
    unique, query_class = _unique(query_labels)
    match_counts = torch.empty(len(unique), dtype=torch.long, device=query_labels.device)
    rows = max(1, _COMPARE_BLOCK // max(1, len(reference_labels)))
    others = reference_labels.unsqueeze(0)
    for start in range(0, len(unique), rows):
        block = unique[start : start + rows]
        matches = _compare(comparison, block.unsqueeze(1), others, (len(block), len(others[0])))
        match_counts[start : start + rows] = matches.sum(dim=1)
    class_relevant = match_counts
    if ref_includes_query:
        matches_itself = _compare(comparison, unique, unique, (len(unique),))
        class_relevant = match_counts - matches_itself.long()
    return LabelStats(
        unique_query_labels=unique,
        query_class=query_class,
        match_counts=match_counts,
        num_relevant=class_relevant[query_class],
    )


def _compare(
    comparison: LabelComparison, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    """Call a custom label comparison and check that it returned one bool per pair."""
    result = comparison(a, b)
    if not isinstance(result, torch.Tensor) or tuple(result.shape) != shape:
        got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
        raise InvalidArgumentError(
            "The 'label_comparison_fn' parameter of AccuracyCalculator must return a tensor "
            f"of shape {shape} when called with labels of shapes {tuple(a.shape)} and "
            f"{tuple(b.shape)} (one result per pair, comparing along the label dimension). "
            f"Got {got} instead."
        )
    return result.bool()
