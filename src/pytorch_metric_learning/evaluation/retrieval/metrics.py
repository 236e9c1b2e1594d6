"""Retrieval metrics as pure functions of a relevance matrix and per-query statistics.

Every k-NN metric takes ``relevance``, a boolean ``(num_queries, k)`` tensor whose entry
``[q, i]`` says whether the ``i``-th nearest neighbour of query ``q`` shares its label, and,
where it needs it, ``num_relevant``: the number ``R`` of references sharing each query's
label (not counting the query itself when the reference includes it). Each returns one
float64 value per query, so that callers choose how to average (over queries, per label,
or per label and then over labels). Queries with ``R = 0`` ("lone" queries) have no
defined value: callers leave them out before calling these functions.

The definitions are those of pytorch-metric-learning 2.x; ``P@i`` is the precision of the
first ``i`` neighbours and ``rel_i`` the relevance of the ``i``-th.
"""

from __future__ import annotations

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "mean_inverse_negative_penalty",
    "first_relevant_rank",
    "recall_at_k",
    "precision_at_k",
    "mean_average_precision_at_k",
    "ndcg_at_k",
    "average",
    "average_per_class",
]


# Elements of the float64 temporaries of one block of rows (8 MiB).
_BLOCK_ELEMENTS = 2**20


def precision_at_1(relevance: torch.Tensor) -> torch.Tensor:
    """``rel_1``: whether each query's nearest neighbour shares its label.

    Args:
        relevance: Boolean ``(num_queries, k)`` tensor, ``k >= 1``, nearest first.

    Returns:
        One float64 value per query, 0 or 1.

    Example:
        >>> relevance = torch.tensor([[True, False], [False, True]])
        >>> precision_at_1(relevance).tolist()
        [1.0, 0.0]
    """
    _check_relevance(relevance, "precision_at_1")
    return relevance[:, 0].to(torch.float64)


def r_precision(relevance: torch.Tensor, num_relevant: torch.Tensor) -> torch.Tensor:
    """Fraction of the first ``min(R, k)`` neighbours that share the query's label.

    Args:
        relevance: Boolean ``(num_queries, k)`` tensor, nearest first.
        num_relevant: ``R`` per query, positive integers.

    Example:
        >>> relevance = torch.tensor([[True, False, True], [False, True, True]])
        >>> r_precision(relevance, torch.tensor([2, 3])).tolist()
        [0.5, 0.6666666666666666]
    """
    cutoff = _cutoff(relevance, num_relevant, "r_precision")
    hits = (relevance & _first_columns(relevance, cutoff)).sum(dim=1)
    return hits.to(torch.float64) / cutoff.to(torch.float64)


def mean_average_precision_at_r(
    relevance: torch.Tensor, num_relevant: torch.Tensor
) -> torch.Tensor:
    """``(1 / R) * sum over i <= min(R, k) of P@i * rel_i`` per query.

    Example:
        >>> relevance = torch.tensor([[True, False, True], [False, True, True]])
        >>> mean_average_precision_at_r(relevance, torch.tensor([2, 3])).tolist()
        [0.5, 0.38888888888888884]
    """
    cutoff = _cutoff(relevance, num_relevant, "mean_average_precision_at_r")
    counted = relevance & _first_columns(relevance, cutoff)
    return _summed_precision(counted) / num_relevant.to(torch.float64)


def mean_average_precision(relevance: torch.Tensor, num_relevant: torch.Tensor) -> torch.Tensor:
    """``(1 / R) * sum over i <= k of P@i * rel_i`` per query (average precision at k).

    Example:
        >>> relevance = torch.tensor([[True, False, True], [False, False, False]])
        >>> mean_average_precision(relevance, torch.tensor([4, 1])).tolist()
        [0.41666666666666663, 0.0]
    """
    _cutoff(relevance, num_relevant, "mean_average_precision")
    return _summed_precision(relevance) / num_relevant.to(torch.float64)


def mean_reciprocal_rank(relevance: torch.Tensor) -> torch.Tensor:
    """``1 / rank`` of the first relevant neighbour, 0 when none of the k is relevant.

    Example:
        >>> relevance = torch.tensor([[False, False, True], [False, False, False]])
        >>> mean_reciprocal_rank(relevance).tolist()
        [0.3333333333333333, 0.0]
    """
    _check_relevance(relevance, "mean_reciprocal_rank")
    # argmax returns the first maximal index: the first relevant column.
    first = relevance.to(torch.uint8).argmax(dim=1)
    reciprocal = 1.0 / (first + 1).to(torch.float64)
    return torch.where(relevance.any(dim=1), reciprocal, torch.zeros_like(reciprocal))


def mean_inverse_negative_penalty(
    relevance: torch.Tensor, num_relevant: torch.Tensor
) -> torch.Tensor:
    """Inverse negative penalty per query: ``R / rank`` of its last relevant neighbour.

    Ye et al., "Deep Learning for Person Re-identification: A Survey and Outlook" (TPAMI
    2021): the share of the ranking a user must read to find every relevant item; their
    mINP is its mean. 0 when fewer than ``R`` relevant neighbours are among the ``k``
    retrieved (the last one is past ``k``; ask for every neighbour, ``k=None``, for the
    exact value).

    Example:
        >>> relevance = torch.tensor([[True, False, True], [False, True, False]])
        >>> mean_inverse_negative_penalty(relevance, torch.tensor([2, 2])).tolist()
        [0.6666666666666666, 0.0]
    """
    _cutoff(relevance, num_relevant, "mean_inverse_negative_penalty")
    columns = torch.arange(1, relevance.shape[1] + 1, device=relevance.device)
    last = torch.zeros(len(relevance), dtype=torch.long, device=relevance.device)
    if relevance.shape[1]:
        last = torch.where(relevance, columns, 0).amax(dim=1)
    found = relevance.sum(dim=1)
    ratio = num_relevant.to(torch.float64) / last.clamp_min(1).to(torch.float64)
    return torch.where(found >= num_relevant, ratio, torch.zeros_like(ratio))


def first_relevant_rank(relevance: torch.Tensor) -> torch.Tensor:
    """The rank (from 1) of each query's first relevant neighbour; 0 when none is retrieved.

    Example:
        >>> first_relevant_rank(torch.tensor([[False, True], [False, False]])).tolist()
        [2, 0]
    """
    if relevance.ndim == 2 and relevance.shape[1] == 0:  # nothing was searched
        return torch.zeros(len(relevance), dtype=torch.long, device=relevance.device)
    _check_relevance(relevance, "first_relevant_rank")
    if relevance.shape[1] == 0:
        return torch.zeros(len(relevance), dtype=torch.long, device=relevance.device)
    first = relevance.to(torch.uint8).argmax(dim=1) + 1
    return torch.where(relevance.any(dim=1), first, torch.zeros_like(first))


def recall_at_k(relevance: torch.Tensor, k: int) -> torch.Tensor:
    """Recall@K as metric-learning papers report it: 1 if any of the first ``k`` is relevant.

    Args:
        relevance: Boolean ``(num_queries, columns)`` tensor, nearest first; columns beyond
            ``k`` are ignored, and fewer than ``k`` columns mean every reference was retrieved.
        k: The cutoff, a positive int.

    Example:
        >>> relevance = torch.tensor([[False, True, False], [False, False, True]])
        >>> recall_at_k(relevance, 2).tolist()
        [1.0, 0.0]
    """
    top = _top(relevance, k, "recall_at_k")
    return top.any(dim=1).to(torch.float64)


def precision_at_k(relevance: torch.Tensor, k: int) -> torch.Tensor:
    """Relevant neighbours among the first ``k``, divided by ``k`` (as 2.x's ``precision_at_k``).

    The divisor is ``k`` even when fewer than ``k`` references exist.

    Example:
        >>> relevance = torch.tensor([[True, True, False], [False, False, True]])
        >>> precision_at_k(relevance, 2).tolist()
        [1.0, 0.0]
    """
    top = _top(relevance, k, "precision_at_k")
    return top.sum(dim=1, dtype=torch.float64) / float(k)


def mean_average_precision_at_k(
    relevance: torch.Tensor, num_relevant: torch.Tensor, k: int
) -> torch.Tensor:
    """``(1 / R) * sum over i <= k of P@i * rel_i``: 2.x's ``mean_average_precision`` at ``k=K``.

    Example:
        >>> relevance = torch.tensor([[True, False, True], [False, True, True]])
        >>> mean_average_precision_at_k(relevance, torch.tensor([2, 4]), 2).tolist()
        [0.5, 0.125]
    """
    top = _top(relevance, k, "mean_average_precision_at_k")
    _cutoff(top, num_relevant, "mean_average_precision_at_k")
    return _summed_precision(top) / num_relevant.to(torch.float64)


def ndcg_at_k(relevance: torch.Tensor, num_relevant: torch.Tensor, k: int) -> torch.Tensor:
    """Normalized discounted cumulative gain at ``k`` with binary relevance.

    ``DCG = sum over i <= k of rel_i / log2(i + 1)``, divided by the DCG of a perfect
    ranking, whose first ``min(R, k)`` neighbours are all relevant.

    Example:
        >>> relevance = torch.tensor([[True, False], [False, True]])
        >>> [round(value, 4) for value in ndcg_at_k(relevance, torch.tensor([1, 1]), 2).tolist()]
        [1.0, 0.6309]
    """
    top = _top(relevance, k, "ndcg_at_k")
    _cutoff(top, num_relevant, "ndcg_at_k")
    ideal_length = num_relevant.clamp(max=k)
    longest = int(ideal_length.max()) if ideal_length.numel() else 0
    columns = max(top.shape[1], longest)
    ranks = torch.arange(2, columns + 2, device=top.device, dtype=torch.float64)
    discounts = 1.0 / torch.log2(ranks)
    gains = row_sums(top.to(torch.float64) * discounts[: top.shape[1]])
    ideal = discounts.cumsum(dim=0)[(ideal_length - 1).clamp(min=0)]
    return gains / ideal


def _top(relevance: torch.Tensor, k: int, owner: str) -> torch.Tensor:
    """The first ``k`` columns of a validated relevance matrix."""
    _check_relevance(relevance, owner)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise invalid("k", owner, "a positive int", k)
    return relevance[:, :k]


def average(values: torch.Tensor) -> float:
    """Mean of per-query values in float64; NaN for no values.

    Example:
        >>> average(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64))
        0.5
    """
    if values.numel() == 0:
        return float("nan")
    return float(values.to(torch.float64).mean())


def average_per_class(
    values: torch.Tensor, class_ids: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Mean of per-query values for each class id, for the classes that have queries.

    Args:
        values: One value per query.
        class_ids: Each query's class, an integer in ``[0, num_classes)``; classes are
            numbered in label order, so the result is ordered by label.
        num_classes: Number of class ids.

    Returns:
        Float64 means of the classes present in ``class_ids``, in class-id order.

    Example:
        >>> values = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
        >>> average_per_class(values, torch.tensor([2, 0, 2, 0]), 3).tolist()
        [0.5, 1.0]
    """
    values = values.to(torch.float64)
    sums = torch.zeros(num_classes, dtype=torch.float64, device=values.device)
    sums.index_add_(0, class_ids, values)
    counts = torch.bincount(class_ids, minlength=num_classes)
    present = counts > 0
    return sums[present] / counts[present].to(torch.float64)


def _check_relevance(relevance: torch.Tensor, owner: str) -> None:
    if not isinstance(relevance, torch.Tensor) or relevance.dtype != torch.bool:
        raise invalid("relevance", owner, "a boolean torch.Tensor", relevance, InvalidTypeError)
    if relevance.ndim != 2 or relevance.shape[1] < 1:
        raise invalid(
            "relevance", owner, "2-D (num_queries, k) with k >= 1", tuple(relevance.shape)
        )


def _cutoff(relevance: torch.Tensor, num_relevant: torch.Tensor, owner: str) -> torch.Tensor:
    """Validate ``num_relevant`` and return ``min(R, k)`` per query."""
    _check_relevance(relevance, owner)
    if num_relevant.shape != relevance.shape[:1] or num_relevant.is_floating_point():
        raise invalid(
            "num_relevant", owner, f"an integer tensor of shape ({len(relevance)},)", num_relevant
        )
    if num_relevant.numel() and int(num_relevant.min()) < 1:
        raise InvalidArgumentError(
            f"The 'num_relevant' parameter of {owner} must be positive for every query; "
            "leave out queries without relevant references (lone queries) first."
        )
    return num_relevant.clamp(max=relevance.shape[1])


def _first_columns(relevance: torch.Tensor, cutoff: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the first ``cutoff[q]`` columns of each row."""
    columns = torch.arange(relevance.shape[1], device=relevance.device)
    return columns.unsqueeze(0) < cutoff.unsqueeze(1)


def _summed_precision(counted: torch.Tensor) -> torch.Tensor:
    """``sum over i of P@i * rel_i`` per row, where ``P@i`` counts only ``counted``.

    Rows are summed a block at a time, so the float64 temporaries stay small.
    """
    ranks = torch.arange(1, counted.shape[1] + 1, device=counted.device, dtype=torch.float64)
    sums = torch.empty(len(counted), device=counted.device, dtype=torch.float64)
    rows = max(1, _BLOCK_ELEMENTS // max(counted.shape[1], 1))
    for start in range(0, len(counted), rows):
        block = counted[start : start + rows]
        hits_so_far = block.cumsum(dim=1, dtype=torch.float64)
        sums[start : start + rows] = row_sums(hits_so_far.div_(ranks).mul_(block))
    return sums


def row_sums(values: torch.Tensor) -> torch.Tensor:
    """Each row's sum, added left to right in one fixed order.

    ``Tensor.sum`` groups its terms by the row's width (vector lanes, pairwise blocks), so
    trailing zero columns could change the last bit; a running sum does not, which keeps
    a metric's value independent of how many neighbours were searched for other metrics.
    """
    if values.shape[1] == 0:
        return torch.zeros(len(values), dtype=values.dtype, device=values.device)
    return values.cumsum(dim=1)[:, -1]
