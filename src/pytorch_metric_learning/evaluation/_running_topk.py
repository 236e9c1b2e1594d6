"""Per-row k smallest values of a matrix offered in chunks, with a running bound.

Each row keeps a buffer of candidates and a bound that at least k of them do not exceed,
so nothing at or above it can enter the row's top k. A new chunk is reduced to the minimum
of each group of ``GROUP`` columns (strided, so the reduction is vectorized); a group whose
minimum is not below the bound is discarded with that one comparison, as faiss's heaps
discard most candidates. Survivors are appended to the buffer; a full buffer is cut back to
its k best with ``torch.topk``, which tightens the bound. A row without a bound yet gets one
from its first chunk: the k-th smallest group minimum, below which lie at least k values.
Exact: only values that cannot be in the top k are ever dropped; ``finish`` sorts the rest,
so the result equals ``torch.topk`` up to the order of ties.
"""

from __future__ import annotations

import torch

__all__ = ["GROUP", "RunningTopK"]

GROUP = 8


class RunningTopK:
    """The k smallest candidates per row, fed chunk by chunk with :meth:`push`.

    Example:
        >>> state = RunningTopK(num_rows=1, k=2, dtype=torch.float32, device=torch.device("cpu"))
        >>> state.push(0, torch.tensor([[3.0, 1.0]]), first_index=0)
        >>> state.push(0, torch.tensor([[0.5, 9.0]]), first_index=2)
        >>> values, indices = state.finish()
        >>> values.tolist(), indices.tolist()
        ([[0.5, 1.0]], [[2, 1]])
    """

    def __init__(self, num_rows: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = k
        self.width = 2 * k + GROUP
        self.values = torch.full((num_rows, self.width), torch.inf, dtype=dtype, device=device)
        self.indices = torch.zeros((num_rows, self.width), dtype=torch.long, device=device)
        self.fill = torch.zeros(num_rows, dtype=torch.long, device=device)
        self.bound = torch.full((num_rows,), torch.inf, dtype=dtype, device=device)

    def push(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + c`` of row ``first_row + r``.

        ``scores`` may be any strided view (a transposed tile feeds its columns' rows).
        """
        whole = scores.shape[1] - scores.shape[1] % GROUP
        if whole:
            self._push_part(first_row, scores[:, :whole], first_index, GROUP)
        if whole < scores.shape[1]:
            self._push_part(first_row, scores[:, whole:], first_index + whole, 1)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The sorted ``(values, indices)`` of each row's k smallest candidates."""
        top = torch.topk(self.values, self.k, dim=1, largest=False, sorted=True)
        return top.values, torch.gather(self.indices, 1, top.indices)

    def _push_part(
        self, first_row: int, scores: torch.Tensor, first_index: int, group: int
    ) -> None:
        rows = slice(first_row, first_row + len(scores))
        stride = scores.shape[1] // group
        group_min = _group_min(scores, group, stride)
        bound = self._bound_with(group_min, self.bound[rows])
        row, column, value = _below(scores, group_min, bound, stride)
        counts = torch.bincount(row, minlength=len(scores))
        full = self.fill[rows] + counts > self.width
        if bool(full.any()):
            self._merge(first_row, full, row, column + first_index, value, counts)
            keep = ~full[row]
            row, column, value, counts = row[keep], column[keep], value[keep], counts * ~full
        self._append(first_row, row, column + first_index, value, counts)
        self.bound[rows] = torch.minimum(self.bound[rows], bound)

    def _bound_with(self, group_min: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
        """Give open rows (no bound yet) the k-th smallest group minimum, just above."""
        open_rows = torch.isinf(bound)
        if group_min.shape[1] < self.k or not bool(open_rows.any()):
            return bound
        kth = torch.topk(group_min[open_rows], self.k, dim=1, largest=False).values[:, -1]
        bound = bound.clone()
        bound[open_rows] = torch.nextafter(kth, torch.tensor(torch.inf, dtype=kth.dtype))
        return bound

    def _append(
        self,
        first_row: int,
        row: torch.Tensor,
        index: torch.Tensor,
        value: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        if len(row) == 0:
            return
        starts = torch.cumsum(counts, 0) - counts
        target = row + first_row
        slot = self.fill[target] + torch.arange(len(row), device=row.device) - starts[row]
        self.values[target, slot] = value
        self.indices[target, slot] = index
        self.fill[first_row : first_row + len(counts)] += counts

    def _merge(
        self,
        first_row: int,
        full: torch.Tensor,
        row: torch.Tensor,
        index: torch.Tensor,
        value: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """Cut full rows back to their k best among the buffer and the new candidates."""
        local = torch.nonzero(full).squeeze(1)
        rank = torch.full_like(full, -1, dtype=torch.long)
        rank[local] = torch.arange(len(local), device=full.device)
        take = full[row]
        new_values, new_index = _padded(rank[row[take]], index[take], value[take], counts[local])
        target = local + first_row
        merged = torch.cat([self.values[target], new_values], dim=1)
        merged_index = torch.cat([self.indices[target], new_index], dim=1)
        top = torch.topk(merged, self.k, dim=1, largest=False, sorted=False)
        fresh = merged.new_full((len(local), self.width - self.k), torch.inf)
        self.values[target] = torch.cat([top.values, fresh], dim=1)
        self.indices[target, : self.k] = torch.gather(merged_index, 1, top.indices)
        self.fill[target] = self.k
        self.bound[target] = top.values.amax(dim=1)


def _group_min(scores: torch.Tensor, group: int, stride: int) -> torch.Tensor:
    """Minimum of columns ``f, f + stride, ...`` per row, reduced along the memory layout."""
    if scores.stride(0) == 1 and scores.stride(1) != 1:  # a transposed tile
        return scores.T.unflatten(0, (group, stride)).amin(dim=0).T.contiguous()
    if group == 1:
        return scores
    return scores.unflatten(1, (group, stride)).amin(dim=1)


def _below(
    scores: torch.Tensor, group_min: torch.Tensor, bound: torch.Tensor, stride: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(row, column, value)`` of the entries below their row's bound, in row order."""
    row, first = torch.nonzero(group_min < bound.unsqueeze(1), as_tuple=True)
    group = scores.shape[1] // stride
    column = first.unsqueeze(1) + torch.arange(group, device=scores.device) * stride
    value = _take(scores, row.unsqueeze(1), column)
    hit = torch.nonzero((value < bound[row].unsqueeze(1)).view(-1)).squeeze(1)
    return (
        row.index_select(0, hit.div(group, rounding_mode="floor")),
        column.view(-1).index_select(0, hit),
        value.view(-1).index_select(0, hit),
    )


def _take(scores: torch.Tensor, row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """``scores[row, column]`` through flat storage offsets (faster than 2-d indexing)."""
    offsets = row * scores.stride(0) + column * scores.stride(1)
    span = (scores.shape[0] - 1) * scores.stride(0) + (scores.shape[1] - 1) * scores.stride(1) + 1
    flat = scores.as_strided((span,), (1,))
    return flat.index_select(0, offsets.view(-1)).view(offsets.shape)


def _padded(
    rank: torch.Tensor, index: torch.Tensor, value: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-ordered candidates as a ``(len(counts), max(counts))`` matrix padded with inf."""
    width = int(counts.max()) if len(counts) else 0
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(rank), device=rank.device) - starts[rank]
    values = value.new_full((len(counts), width), torch.inf)
    indices = index.new_zeros((len(counts), width))
    values[rank, slot] = value
    indices[rank, slot] = index
    return values, indices
