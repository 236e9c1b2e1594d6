"""Rows to their nearest centres for ``_lloyd``: blocked GEMMs and the bounds they give.

Distances come from ``|x|^2 - 2 x.c + |c|^2``, one GEMM per block of rows sized to stay in
a CPU's cache between the GEMM that writes it and the minima that read it. On CPU the
row-wise minimum with its index is several times slower than the minimum alone, so a
row that keeps its previous centre (the common case after the first iterations) is
found from the minimum alone. Bounds are widened by the expansion's rounding error so
that they stay bounds.
"""

from __future__ import annotations

import torch

# Elements and rows of one (rows, clusters) distance block.
_BLOCK_ELEMENTS = 1 << 20
_BLOCK_ROWS = 4096


def nearest(x: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Nearest centre of every row, in row blocks."""
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    centers_sq = (centers * centers).sum(dim=1)
    rows = _block_rows(len(centers))
    scores = x.new_empty((min(rows, len(x)), len(centers)))
    for start in range(0, len(x), rows):
        block = x[start : start + rows]
        torch.addmm(centers_sq, block, centers.T, alpha=-2, out=scores[: len(block)])
        labels[start : start + rows] = scores[: len(block)].argmin(dim=1)
    return labels


def nearest_two(
    x: torch.Tensor,
    centers: torch.Tensor,
    hint: torch.Tensor | None = None,
    x_sq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest centre of every row, an upper bound on the distance to it and a lower bound
    on the distance to the second nearest (``inf`` with one centre), in row blocks.

    Distances come from ``|x|^2 - 2 x.c + |c|^2`` (``x_sq``: the rows' ``|x|^2``) in the
    input's precision; the bounds are widened by that expansion's rounding error so that
    they stay bounds. A row whose ``hint`` (its centre before the centres moved) is still
    among its nearest keeps it; only the others are searched for their nearest centre,
    because on CPU that search is many times slower than the minimum distance alone.
    """
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    upper = torch.empty(len(x), dtype=x.dtype, device=x.device)
    lower = torch.full((len(x),), float("inf"), dtype=x.dtype, device=x.device)
    x_sq = (x * x).sum(dim=1) if x_sq is None else x_sq
    centers_sq = (centers * centers).sum(dim=1)
    rows = _block_rows(len(centers))
    buffer = x.new_empty((min(rows, len(x)), len(centers)))
    for start in range(0, len(x), rows):
        block, block_sq = x[start : start + rows], x_sq[start : start + rows]
        scores = torch.addmm(centers_sq, block, centers.T, alpha=-2, out=buffer[: len(block)])
        first = scores.amin(dim=1)
        indices = _argmin(scores, first, None if hint is None else hint[start : start + rows])
        error = _rounding(block_sq, centers_sq, x.shape[1])
        labels[start : start + rows] = indices
        upper[start : start + rows] = (first + block_sq + error).clamp_(min=0).sqrt_()
        if len(centers) > 1:
            second = scores.scatter_(1, indices.unsqueeze(1), float("inf")).amin(dim=1)
            lower[start : start + rows] = (second + block_sq - error).clamp_(min=0).sqrt_()
    return labels, upper, lower


def _argmin(scores: torch.Tensor, first: torch.Tensor, hint: torch.Tensor | None) -> torch.Tensor:
    """Column of each row's minimum ``first``: ``hint`` where that column holds it."""
    if hint is None:
        return scores.argmin(dim=1)
    indices = hint.clone()
    lost = torch.nonzero(scores.gather(1, hint.unsqueeze(1)).squeeze(1) > first).flatten()
    indices.index_copy_(0, lost, scores.index_select(0, lost).argmin(dim=1))
    return indices


def nearest_other(
    x: torch.Tensor,
    x_sq: torch.Tensor,
    centers: torch.Tensor,
    among: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """A lower bound on the distance of every row to the nearest of the centres ``among``
    other than its own (``labels``), ``inf`` where there is none; as ``nearest_two``."""
    chosen = centers.index_select(0, among)
    chosen_sq = (chosen * chosen).sum(dim=1)
    lower = torch.empty(len(x), dtype=x.dtype, device=x.device)
    rows = _block_rows(len(among))
    for start in range(0, len(x), rows):
        block, block_sq = x[start : start + rows], x_sq[start : start + rows]
        scores = torch.addmm(chosen_sq, block, chosen.T, alpha=-2)
        own = labels[start : start + rows].unsqueeze(1) == among
        second = scores.masked_fill_(own, float("inf")).amin(dim=1)
        error = _rounding(block_sq, chosen_sq, x.shape[1])
        lower[start : start + rows] = (second + block_sq - error).clamp_(min=0).sqrt_()
    return lower


def _block_rows(columns: int) -> int:
    """Rows of one distance block with ``columns`` columns."""
    return max(1, min(_BLOCK_ROWS, _BLOCK_ELEMENTS // columns))


def _rounding(x_sq: torch.Tensor, centers_sq: torch.Tensor, dims: int) -> torch.Tensor:
    """A bound on the rounding error of ``|x|^2 - 2 x.c + |c|^2`` for each row."""
    return 16 * torch.finfo(x_sq.dtype).eps * dims**0.5 * (x_sq + centers_sq.max())
