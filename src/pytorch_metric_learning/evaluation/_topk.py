"""Row-wise top-k that reads most of each row with cheap reductions and one comparison.

The main part of each row is reduced to group minima twice: level 1 takes the minimum of
``GROUP`` strided columns, level 2 the minimum of ``fanout`` strided level-1 groups
(reductions along the memory layout, several times faster than ``torch.topk``). The k-th
smallest level-2 minimum ``t`` is a value of the row with at least k values at or below it
(every level-2 minimum is a distinct entry of the row), so the row's top k lie at or below
``t``. Only the level-2 groups whose minimum is at most ``t`` are opened (or, when k is large
against the row, every level-1 minimum is compared), then their level-1 groups that are,
then those entries: a few times k candidates per row, whose top k is the
answer. The columns that do not fill a level-2 group are kept as candidates whole.
"""

from __future__ import annotations

import torch

__all__ = ["topk"]

GROUP = 8
# Level-2 groups a row keeps per neighbour asked for: fewer make the threshold looser.
_GROUPS_PER_K = 2.5
_MAX_FANOUT = 16
# Rows selected at once: the candidates of a few rows stay in cache while they are gathered.
_ROWS = 128


def topk(values: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(values, indices)`` of the k largest (or smallest) entries of each row.

    Equal to ``torch.topk(values, k, dim=1, largest=largest)`` up to the order of ties.

    Example:
        >>> topk(torch.tensor([[3.0, 1.0, 2.0]]), 2, largest=False)[1].tolist()
        [[1, 2]]
    """
    if largest:
        top, indices = topk(values.neg(), k, largest=False)
        return top.neg_(), indices
    fanout = _fanout(values.shape[1], k)
    if fanout == 0 or values.shape[0] == 0:
        whole = torch.topk(values, k, dim=1, largest=False, sorted=True)
        return whole.values, whole.indices
    values = values.contiguous()
    if len(values) <= _ROWS:
        return _threshold_topk(values, k, fanout)
    parts = [
        _threshold_topk(values[r : r + _ROWS], k, fanout) for r in range(0, len(values), _ROWS)
    ]
    return torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])


def _fanout(width: int, k: int) -> int:
    """Level-1 groups per level-2 group for rows of ``width``; 0 when too narrow to pay."""
    fanout = _MAX_FANOUT
    while fanout >= 2 and width // (GROUP * fanout) < _GROUPS_PER_K * k:
        fanout //= 2
    return fanout if fanout >= 2 else 0


def _threshold_topk(values: torch.Tensor, k: int, fanout: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, width = values.shape
    stride1 = width // (GROUP * fanout) * fanout  # level-1 group j: columns j + g * stride1
    stride2 = stride1 // fanout  # level-2 group i: level-1 groups i + f * stride2
    main = GROUP * stride1
    level1 = values[:, :main].view(rows, GROUP, stride1).amin(dim=1)
    level2 = level1.view(rows, fanout, stride2).amin(dim=1)
    if bool(torch.isnan(level2).any()):  # NaN hides its group's other entries: sort it all
        whole = torch.topk(values, k, dim=1, largest=False, sorted=True)
        return whole.values, whole.indices
    bound = torch.topk(level2, k, dim=1, largest=False, sorted=False).values.amax(dim=1)
    if fanout < _MAX_FANOUT:  # many candidates: comparing every level-1 minimum is cheaper
        row, group = torch.nonzero(level1 <= bound.unsqueeze(1), as_tuple=True)
    else:
        row, group = torch.nonzero(level2 <= bound.unsqueeze(1), as_tuple=True)
        row, group = _open(level1, row, group, stride2, fanout, bound)
    row, column = _open(values, row, group, stride1, GROUP, bound)
    candidates, index = _padded(values, row, column, rows)
    if main < width:  # the columns left over by the groups are all candidates
        tail = torch.arange(main, width, device=values.device).expand(rows, -1)
        candidates = torch.cat([candidates, values[:, main:]], dim=1)
        index = torch.cat([index, tail], dim=1)
    top = torch.topk(candidates, k, dim=1, largest=False, sorted=True)
    return top.values, torch.gather(index, 1, top.indices)


def _open(
    values: torch.Tensor,
    row: torch.Tensor,
    first: torch.Tensor,
    stride: int,
    members: int,
    bound: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-ordered ``(row, column)`` of the members ``first + m * stride`` at most the bound.

    ``row`` must be in non-decreasing order; the result keeps that order.
    """
    steps = torch.arange(members, device=values.device) * stride
    column = (first.unsqueeze(1) + steps).view(-1)
    repeated = row.repeat_interleave(members)
    member = values.view(-1).index_select(0, repeated * values.shape[1] + column)
    keep = torch.nonzero(member <= bound.index_select(0, repeated)).squeeze(1)
    return repeated.index_select(0, keep), column.index_select(0, keep)


def _padded(
    values: torch.Tensor, row: torch.Tensor, column: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-ordered entries as ``(rows, most per row)`` values (padded with inf) and columns."""
    counts = torch.bincount(row, minlength=rows)
    width = int(counts.max()) if len(row) else 0
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(row), device=row.device) - starts.index_select(0, row)
    flat = row * width + slot
    found = values.view(-1).index_select(0, row * values.shape[1] + column)
    padded = values.new_full((rows * width,), torch.inf).index_copy_(0, flat, found)
    index = column.new_zeros(rows * width).index_copy_(0, flat, column)
    return padded.view(rows, width), index.view(rows, width)
