"""Exact search over tiles of the score matrix: one matrix product per tile, running top-k.

A *scorer* turns a tile of (query rows, reference rows) into scores to minimize with one
GEMM. ``search_symmetric`` searches a set against itself and walks only the tiles on and
above the diagonal: the score matrix is symmetric, so each tile feeds the top-k of its rows
and, transposed, that of its columns, halving the arithmetic.
Tiles are pushed to :class:`RunningTopK` in chunks of ``CHUNK`` columns, so a tall block
(``batch_size`` rows by the whole reference) still gets the running bound.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ._progress import SearchProgress
from ._running_topk import GROUP, RunningTopK

__all__ = [
    "CHUNK",
    "NegatedInnerProduct",
    "Scorer",
    "SeparateSquaredEuclidean",
    "SquaredEuclidean",
    "search_symmetric",
    "square_tile",
]

CHUNK = 2048


class Scorer(Protocol):
    """Scores of one tile, smaller is nearer; ``finish`` maps kept scores to distances."""

    def tile(self, rows: slice, cols: slice, out: torch.Tensor) -> torch.Tensor: ...

    def picked(self, rows: slice | torch.Tensor, cols: slice | torch.Tensor) -> torch.Tensor: ...

    def finish(self, scores: torch.Tensor) -> torch.Tensor: ...


class SquaredEuclidean:
    """``|r|^2 - 2 q.r``, plus ``|q|^2`` when the tiles must be symmetric, as one product.

    The squared norms ride along as extra columns (``[|q|^2, 1, q] . [1, |r|^2, -2r]``), so
    a tile is a single matrix product with no pass to add them. They come first: a product
    accumulates its terms in column order, so the score of ``(i, j)`` starts from
    ``|q_i|^2 + |r_j|^2``, which rounds as ``|r_j|^2 + |q_i|^2`` does, and a symmetric
    matrix's two halves are equal to the bit (with the norms last, the last two terms were
    added in a different order on the two sides: identical rows then lay a rounding error
    apart, one of them out of index order).
    """

    def __init__(
        self,
        query: torch.Tensor,
        ref: torch.Tensor,
        symmetric: bool,
        order: torch.Tensor | None = None,
    ) -> None:
        """``order``: the reference rows to use, in that order (and the query's too when
        ``ref is query``); the augmented copies are built ``BUILD_ROWS`` rows at a time, so
        a large reference is copied once, not three times (reordered, scaled, joined)."""
        self.symmetric = symmetric
        query_order = order if ref is query else None
        self.query_sq = _squared_norms(query, query_order)
        ref_sq = self.query_sq if ref is query else _squared_norms(ref, order)
        query_ones, ref_ones = torch.ones_like(self.query_sq), torch.ones_like(ref_sq)
        if symmetric:
            self.query = _augmented(query, query_order, 1, [self.query_sq, query_ones])
            self.ref = _augmented(ref, order, -2, [ref_ones, ref_sq])
        else:
            self.query = _augmented(query, query_order, 1, [query_ones])
            self.ref = _augmented(ref, order, -2, [ref_sq])

    def tile(self, rows: slice, cols: slice, out: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.query[rows], self.ref[cols].T, out=out)

    def picked(self, rows: slice | torch.Tensor, cols: slice | torch.Tensor) -> torch.Tensor:
        """Scores of the query rows and reference rows at these indices."""
        return torch.mm(self.query[rows], self.ref[cols].T)

    def finish(self, scores: torch.Tensor) -> torch.Tensor:
        if not self.symmetric:
            scores = scores + self.query_sq
        return scores.clamp_min_(0)


class SeparateSquaredEuclidean:
    """``|r|^2 - 2 q.r`` of a separate search, without copying the reference: each tile is
    one ``addmm`` onto the reference's squared norms (``|q|^2`` is added by ``finish``).

    The reference is read where it lies, so a search of any size holds one tile beyond its
    inputs and outputs (a joined ``[-2 r, |r|^2]`` copy would be as large as the
    reference, 516 MB for a million rows of 128 floats).
    """

    def __init__(self, query: torch.Tensor, ref: torch.Tensor) -> None:
        self.query, self.ref = query, ref
        self.query_sq = _squared_norms(query, None)
        self.ref_sq = _squared_norms(ref, None).view(1, -1)

    def tile(self, rows: slice, cols: slice, out: torch.Tensor) -> torch.Tensor:
        return torch.addmm(
            self.ref_sq[:, cols], self.query[rows], self.ref[cols].T, alpha=-2, out=out
        )

    def picked(self, rows: slice | torch.Tensor, cols: slice | torch.Tensor) -> torch.Tensor:
        """Scores of the query rows and reference rows at these indices."""
        return torch.addmm(self.ref_sq[:, cols], self.query[rows], self.ref[cols].T, alpha=-2)

    def finish(self, scores: torch.Tensor) -> torch.Tensor:
        return (scores + self.query_sq).clamp_min_(0)

    def columns(self, index: torch.Tensor) -> SeparateSquaredEuclidean:
        """The same scorer against the reference rows at ``index`` only (copied)."""
        part = SeparateSquaredEuclidean.__new__(SeparateSquaredEuclidean)
        part.query, part.query_sq = self.query, self.query_sq
        part.ref, part.ref_sq = self.ref[index], self.ref_sq[:, index]
        return part


# Rows per block when the scorers copy their inputs: the temporaries stay small.
BUILD_ROWS = 65_536


def _blocks(x: torch.Tensor, order: torch.Tensor | None) -> list[tuple[int, torch.Tensor]]:
    """``(first row, rows)`` of ``x`` (reordered by ``order``) in blocks of ``BUILD_ROWS``."""
    rows = len(x) if order is None else len(order)
    return [
        (
            start,
            x[start : start + BUILD_ROWS]
            if order is None
            else x[order[start : start + BUILD_ROWS]],
        )
        for start in range(0, rows, BUILD_ROWS)
    ]


def _squared_norms(x: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Each row's sum of squares, ``(rows, 1)``, block by block."""
    sums = [(block * block).sum(dim=1, keepdim=True) for _, block in _blocks(x, order)]
    return torch.cat(sums) if sums else x.new_zeros((0, 1))


def _augmented(
    x: torch.Tensor, order: torch.Tensor | None, scale: int, columns: list[torch.Tensor]
) -> torch.Tensor:
    """``[*columns, scale * x[order]]`` written block by block into one new tensor."""
    rows, extra = (len(x) if order is None else len(order)), len(columns)
    out = torch.empty((rows, extra + x.shape[1]), dtype=x.dtype, device=x.device)
    for start, block in _blocks(x, order):
        torch.mul(block, scale, out=out[start : start + len(block), extra:])
    for position, column in enumerate(columns):
        out[:, position] = column[:, 0]
    return out


class NegatedInnerProduct:
    """``-q.r``: the largest inner products are the smallest scores."""

    def __init__(
        self, query: torch.Tensor, ref: torch.Tensor, order: torch.Tensor | None = None
    ) -> None:
        """``order``: as for :class:`SquaredEuclidean`."""
        if order is not None:
            same = ref is query
            ref = ref.index_select(0, order)
            query = ref if same else query
        self.query, self.ref = query, ref

    def tile(self, rows: slice, cols: slice, out: torch.Tensor) -> torch.Tensor:
        return torch.mm(self.query[rows], self.ref[cols].T, out=out).neg_()

    def picked(self, rows: slice | torch.Tensor, cols: slice | torch.Tensor) -> torch.Tensor:
        """Scores of the query rows and reference rows at these indices."""
        return torch.mm(self.query[rows], self.ref[cols].T).neg_()

    def finish(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.neg()

    def columns(self, index: torch.Tensor) -> NegatedInnerProduct:
        """The same scorer against the reference rows at ``index`` only (copied)."""
        return NegatedInnerProduct(self.query, self.ref[index])


def square_tile(budget_bytes: int, element_size: int) -> int:
    """The side of the largest square tile (a multiple of ``GROUP``) within the budget."""
    side = int((budget_bytes // element_size) ** 0.5)
    return max(GROUP, side - side % GROUP)


def search_symmetric(
    scorer: Scorer,
    size: tuple[int, int, int],
    tile: tuple[int, int],
    like: torch.Tensor,
    skip_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of every row of a symmetric score matrix from its tiles on and above the diagonal.

    ``size`` is ``(num_rows, num_rows, k)``; ``skip_diagonal`` leaves each row's own entry
    out.
    """
    num_rows, _, k = size
    tile_rows, tile_cols = tile
    state = RunningTopK(num_rows, k, like.dtype, like.device)
    buffer = _buffer(min(tile_rows, num_rows) * min(tile_cols, num_rows), like)
    with SearchProgress(num_rows * (num_rows + 1) // 2) as progress:
        for r0 in range(0, num_rows, tile_rows):
            r1 = min(r0 + tile_rows, num_rows)
            for c0 in range(r0, num_rows, tile_cols):
                cols = slice(c0, min(c0 + tile_cols, num_rows))
                scores = scorer.tile(slice(r0, r1), cols, _view(buffer, slice(r0, r1), cols))
                if skip_diagonal:  # the entries (i, i) of this tile, if any
                    scores.diagonal(offset=r0 - c0).fill_(torch.inf)
                _push(state, r0, scores, c0)
                below = max(r1 - c0, 0)  # columns that are rows of this block: already fed
                if below < scores.shape[1]:
                    _push(state, c0 + below, scores[:, below:].T, r0)
                progress.update(scores.numel() - below * (below - 1) // 2)
    values, indices = state.finish()
    return scorer.finish(values), indices


def _push(state: RunningTopK, first_row: int, scores: torch.Tensor, first_index: int) -> None:
    for start in range(0, scores.shape[1], CHUNK):
        state.push(first_row, scores[:, start : start + CHUNK], first_index + start)


def _buffer(size: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(size, dtype=like.dtype, device=like.device)


def _view(buffer: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
    shape = (rows.stop - rows.start, cols.stop - cols.start)
    return buffer[: shape[0] * shape[1]].view(shape)
