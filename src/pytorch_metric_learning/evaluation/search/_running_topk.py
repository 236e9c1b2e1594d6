"""Per-row k smallest values of a matrix offered in chunks, with a running bound.

Each row keeps a buffer of candidates and a bound that at least k of its values do not
exceed, so nothing at or above it can enter the row's top k. A chunk is reduced twice to
group minima: level 1 takes the minimum of each ``GROUP`` strided columns, level 2 the
minimum of each ``GROUP`` strided level-1 groups (reductions along the memory layout,
several times cheaper than any selection). Only the level-2 groups whose minimum beats the
bound are opened, then only their level-1 groups that beat it, then only those elements: as
faiss's heaps do, one comparison discards most candidates. Survivors are appended to the
buffer; a full buffer is cut back to its k best with ``torch.topk``, which tightens the
bound. A row without a bound yet gets one from its first chunk: the k-th smallest group
minimum of the coarsest level with at least k groups (each group minimum is a value of the
row, so at least k values lie at or below it).
Exact: only values that cannot be in the top k are ever dropped; ``finish`` sorts the rest,
so the result equals ``torch.topk`` up to the order of ties.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

__all__ = ["GROUP", "RunningTopK"]

Found = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
BoundOf = Callable[[tuple[torch.Tensor, ...]], torch.Tensor]

GROUP = 8
# Columns a chunk needs for the two-level reduction; the rest is compared one by one.
_BLOCK = GROUP * GROUP


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
        whole = scores.shape[1] - scores.shape[1] % _BLOCK
        rows = slice(first_row, first_row + len(scores))
        open_bound = partial(self._open_bound, rows)
        if whole:
            found = _survivors_grouped(scores[:, :whole], open_bound)
            self._add(first_row, rows, *found, first_index)
        if whole < scores.shape[1]:
            found = _survivors_plain(scores[:, whole:], open_bound)
            self._add(first_row, rows, *found, first_index + whole)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The sorted ``(values, indices)`` of each row's k smallest candidates."""
        top = torch.topk(self.values, self.k, dim=1, largest=False, sorted=True)
        return top.values, torch.gather(self.indices, 1, top.indices)

    def _open_bound(self, rows: slice, levels: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The rows' bound, where still open (inf) taken from the coarsest level with k groups.

        ``levels`` are the chunk's group minima, coarsest first.
        """
        bound = self.bound[rows]
        open_rows = torch.isinf(bound)
        usable = [level for level in levels if level.shape[1] >= self.k]
        if not usable or not bool(open_rows.any()):
            return bound
        kth = torch.topk(usable[0][open_rows], self.k, dim=1, largest=False).values[:, -1]
        bound = bound.clone()
        bound[open_rows] = torch.nextafter(kth, torch.tensor(torch.inf, dtype=kth.dtype))
        return bound

    def _add(
        self,
        first_row: int,
        rows: slice,
        bound: torch.Tensor,
        row: torch.Tensor,
        column: torch.Tensor,
        value: torch.Tensor,
        first_index: int,
    ) -> None:
        """Append row-ordered survivors, first merging the rows whose buffer would overflow."""
        counts = torch.bincount(row, minlength=rows.stop - rows.start)
        full = self.fill[rows] + counts > self.width
        index = column + first_index
        if bool(full.any()):
            self._merge(first_row, full, row, index, value, counts)
            keep = ~full[row]
            row, index, value, counts = row[keep], index[keep], value[keep], counts * ~full
        self._append(first_row, row, index, value, counts)
        self.bound[rows] = torch.minimum(self.bound[rows], bound)

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


def _survivors_grouped(scores: torch.Tensor, open_bound: BoundOf) -> Found:
    """``(bound, row, column, value)``: the entries below their row's bound, in row order.

    ``scores`` has a multiple of ``GROUP * GROUP`` columns.
    """
    num_rows, width = scores.shape
    stride1 = width // GROUP  # level-1 group j: columns j, j + stride1, ...
    stride2 = stride1 // GROUP  # level-2 group i: level-1 groups i, i + stride2, ...
    level1 = _group_min(scores, stride1)
    level2 = level1.view(num_rows, GROUP, stride2).amin(dim=1)
    bound = open_bound((level2, level1))
    row, group2 = torch.nonzero(level2 < bound.unsqueeze(1), as_tuple=True)
    group1 = _spread(group2, stride2)
    hit = _hits(level1.view(-1).index_select(0, (row * stride1 + group1).view(-1)), row, bound)
    row, group1 = _pick(row, hit), group1.view(-1)[hit]
    column = _spread(group1, stride1)
    value = _take(scores, row.expand_as(column), column)
    hit = _hits(value.view(-1), row, bound)
    return _row_order(bound, _pick(row, hit), column.view(-1)[hit], value.view(-1)[hit])


def _survivors_plain(scores: torch.Tensor, open_bound: BoundOf) -> Found:
    """``(bound, row, column, value)`` of a narrow chunk, compared entry by entry."""
    bound = open_bound(())
    row, column = torch.nonzero(scores < bound.unsqueeze(1), as_tuple=True)
    return bound, row, column, scores[row, column]


def _spread(first: torch.Tensor, stride: int) -> torch.Tensor:
    """``(GROUP, len(first))`` members ``first + g * stride`` of each strided group."""
    steps = torch.arange(GROUP, device=first.device) * stride
    return steps.unsqueeze(1) + first.unsqueeze(0)


def _hits(values: torch.Tensor, row: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Flat positions in ``(GROUP, len(row))`` ``values`` below the bound of their ``row``."""
    below = values.view(GROUP, -1) < bound.index_select(0, row).unsqueeze(0)
    return torch.nonzero(below.view(-1)).squeeze(1)


def _pick(row: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The rows of flat positions in a ``(GROUP, len(row))`` spread of ``row``."""
    return row.index_select(0, flat % max(len(row), 1))


def _row_order(
    bound: torch.Tensor, row: torch.Tensor, column: torch.Tensor, value: torch.Tensor
) -> Found:
    order = torch.argsort(row, stable=True)
    return bound, row[order], column[order], value[order]


def _group_min(scores: torch.Tensor, stride: int) -> torch.Tensor:
    """Minimum of columns ``f, f + stride, ...`` per row, reduced along the memory layout."""
    if scores.stride(0) == 1 and scores.stride(1) != 1:  # a transposed tile
        return scores.T.unflatten(0, (GROUP, stride)).amin(dim=0).T.contiguous()
    return scores.unflatten(1, (GROUP, stride)).amin(dim=1)


def _take(scores: torch.Tensor, row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """``scores[row, column]`` through flat storage offsets (faster than 2-d indexing)."""
    offsets = row * scores.stride(0) + column * scores.stride(1)
    span = (scores.shape[0] - 1) * scores.stride(0) + (scores.shape[1] - 1) * scores.stride(1) + 1
    flat = scores.as_strided((span,), (1,))
    return flat.index_select(0, offsets.reshape(-1)).view(offsets.shape)


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
