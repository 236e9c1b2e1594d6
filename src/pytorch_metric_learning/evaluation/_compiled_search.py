"""Exact search over square tiles with compiled running top-k and a sampled first bound.

Before the sweep, each query row is scored against ``SAMPLE`` evenly spaced reference rows.
If the k-th smallest of the row's n scores were spread like the sample, about ``k m / n`` of
the m sampled scores would lie below it; the bound is the sampled score of rank
``k m / n + SPREAD * sqrt(k m / n) + 1``, so that with high probability at least k scores of
the row lie below it. The sweep then keeps only scores below each row's bound (and tightens
it as candidates accumulate, see ``_compiled_topk``). A row that ends with fewer than k
candidates had too low a bound; it is searched again over its whole row, so the result is
exact whatever the data (and only slower when the sample misleads).
Self-search walks only the tiles on and above the diagonal: each feeds its rows and,
through its columns, the rows of its column block.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._compiled_topk import CompiledTopK
from ._tiled_search import Scorer
from ._topk import topk

__all__ = ["SAMPLE", "search_compiled"]

# Reference rows scored for every query row to set its first bound.
SAMPLE = 1024
# Standard deviations added to the expected sampled rank of the k-th score.
SPREAD = 3.0


def search_compiled(
    scorer: Scorer,
    size: tuple[int, int, int],
    symmetric: bool,
    side: int,
    skip_diagonal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(scores, indices)`` of each query row's k smallest scores.

    ``size`` is ``(num_query, num_ref, k)``. ``skip_diagonal`` (a set searched against
    itself) leaves each row's own entry out.
    """
    num_query, num_ref, k = size
    state = CompiledTopK(num_query, k)
    _sampled_bound(state, scorer, num_query, num_ref, k, side)
    buffer = torch.empty(min(side, num_query) * min(side, num_ref), dtype=torch.float32)
    for r0 in range(0, num_query, side):
        rows = slice(r0, min(r0 + side, num_query))
        for c0 in range(r0 if symmetric else 0, num_ref, side):
            cols = slice(c0, min(c0 + side, num_ref))
            out = buffer[: (rows.stop - r0) * (cols.stop - c0)].view(rows.stop - r0, -1)
            scores = scorer.tile(rows, cols, out)
            if skip_diagonal and c0 == r0:
                scores.diagonal().fill_(torch.inf)
            if symmetric and c0 != r0:
                state.push_both(r0, scores, c0)
            else:
                state.push_rows(r0, scores, c0)
    short = torch.from_numpy(np.nonzero(state.count < k)[0])
    values, indices = state.finish()
    if len(short):
        _search_whole_rows(scorer, short, (num_ref, k), side, skip_diagonal, (values, indices))
    return values, indices


def _sampled_bound(
    state: CompiledTopK, scorer: Scorer, num_query: int, num_ref: int, k: int, side: int
) -> None:
    """Set each row's bound to the sampled score expected to have k scores below it."""
    size = min(SAMPLE, num_ref)
    expected = k * size / num_ref
    rank = max(1, math.ceil(expected + SPREAD * math.sqrt(expected) + 1))
    if rank * 2 > size:  # the sample says little: the first tile sets the bound
        return
    sample = torch.arange(size) * num_ref // size
    for r0 in range(0, num_query, side):
        rows = slice(r0, min(r0 + side, num_query))
        state.bound[rows] = state.kth_smallest(scorer.picked(rows, sample), rank).numpy()


def _search_whole_rows(
    scorer: Scorer,
    rows: torch.Tensor,
    size: tuple[int, int],
    side: int,
    skip_diagonal: bool,
    out: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Overwrite ``rows`` of ``out = (values, indices)`` with a search of their whole rows.

    ``size`` is ``(num_ref, k)``.
    """
    num_ref, k = size
    step = max(1, side * side // max(num_ref, 1))
    every = slice(0, num_ref)
    for start in range(0, len(rows), step):
        part = rows[start : start + step]
        scores = scorer.picked(part, every)
        if skip_diagonal:
            scores[torch.arange(len(part)), part] = torch.inf
        out[0][part], out[1][part] = topk(scores, k, largest=False)
