"""Exact search over square tiles with compiled running top-k and a sampled first bound.

A self-search reorders the reference rows (:func:`sample_first`) so that the first tile
column is an evenly spaced sample of them. The first tile of each row block is therefore
the row's scores against that sample, which set the row's first bound before any candidate
is kept, at no cost beyond the tile itself. A separate search reads the reference where it
lies (no reordered copy) and scores each row block against the sample apart, a
``side``-column product that sets the bounds and offers no candidates
(:class:`Sample`). Either way, if the k-th smallest of the row's n scores
were spread like the sample, about ``k m / n`` of the m sampled scores would lie below
it, and the bound is the sampled score of rank ``k m / n + SPREAD * sqrt(k m / n) + 1``,
so that with high probability at least k scores of the row lie below it. The sweep then
keeps only scores below each row's bound (and tightens it as candidates accumulate, see
``_compiled_topk``). A row that ends with fewer than k candidates had too low a bound; it
is searched again over its whole row, so the result is exact whatever the data (and only
slower when the sample misleads). Candidates are renamed to the original reference rows
before the final sort, so ties are ordered by original index.
On several threads, each thread computes and offers whole tiles alone, with PyTorch on
one thread meanwhile: a separate search gives each thread whole row blocks, a self-search
gives it tiles whose two row blocks no other thread is feeding (see
:func:`_walk_tiles_in_parallel`). A separate search computes and offers each tile in
blocks that stay in cache.
Self-search walks only the tiles on and below the diagonal, row block by row block from
the sample's: each tile feeds its rows and, through its columns, the rows of its column
block, whose bounds their own first tile has already set.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..._threads import dynamic_threads
from ..._threads import one_torch_thread as _one_torch_thread
from ._compiled_topk import CompiledTopK, _in_parts
from ._filtered_topk import FilteredTopK
from ._progress import SearchProgress
from ._tiled_search import Scorer
from ._topk import topk
from .exclusion import Exclusion

__all__ = ["Sample", "sample_first", "search_compiled", "spaced_sample"]

# Standard deviations added to the expected sampled rank of the k-th score.
SPREAD = 3.0
# A separate search computes and offers each tile in blocks of at most this many rows and
# columns, whose scores stay in cache from the product to the top-k (a whole tile of 16 MiB
# does not): 4-6% less time at n=20,000 to 50,000, k=100. A self-search keeps whole tiles,
# for which blocks took 7% more time (each block reloads its columns' bounds).
BLOCK_ROWS = 512
BLOCK_COLUMNS = 1024
# A separate search of fewer than ``threads * side`` query rows gives each thread row blocks
# of an equal share of them, but not fewer than this many rows (their products would
# re-read the reference too often): at 1,290 queries x 200,000 references and k = 2,001,
# two threads took 0.6 of one thread's time.
MIN_THREAD_ROWS = 256


@dataclass(frozen=True)
class Sample:
    """The query's scorer against the reference ``rows`` (evenly spaced, see
    :func:`spaced_sample`), which sets each query row's first bound in a walk over the
    reference as it lies."""

    scorer: Scorer
    rows: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.rows)


def spaced_sample(num_ref: int, side: int) -> torch.Tensor | None:
    """``side`` evenly spaced rows of ``num_ref``; None when a single tile column holds them
    all (the first tile then sets the bounds).

    Example:
        >>> spaced_sample(10, 4).tolist()
        [0, 2, 5, 7]
    """
    if num_ref <= side:
        return None
    return torch.arange(side) * num_ref // side


def sample_first(num_ref: int, side: int) -> torch.Tensor | None:
    """An order of ``num_ref`` reference rows that starts with ``side`` evenly spaced ones
    (then the others, in order); None when a single tile column holds them all.

    Example:
        >>> sample_first(10, 4).tolist()
        [0, 2, 5, 7, 1, 3, 4, 6, 8, 9]
    """
    sample = spaced_sample(num_ref, side)
    if sample is None:
        return None
    others = torch.ones(num_ref, dtype=torch.bool)
    others[sample] = False
    return torch.cat([sample, torch.nonzero(others).squeeze(1)])


def search_compiled(
    scorer: Scorer,
    size: tuple[int, int, int],
    symmetric: bool,
    side: int,
    skip_diagonal: bool = False,
    order: torch.Tensor | None = None,
    exclusion: Exclusion | None = None,
    sample: Sample | None = None,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(scores, indices)`` of each query row's k smallest scores.

    ``size`` is ``(num_query, num_ref, k)``. ``skip_diagonal`` (a set searched against
    itself) leaves each row's own entry out. ``order`` is :func:`sample_first` of the
    reference, which the scorer's reference rows (and, when ``symmetric``, its query
    rows) follow; the outputs are in the original rows and indices. ``exclusion`` (of a
    separate search, in the reordered reference's rows) scores its pairs as inf in each
    tile before the tile is offered; a row left with fewer than k candidates is searched
    again over its whole row, where its excluded pairs come last. ``compiled=False``
    keeps the running top-k in PyTorch (:class:`FilteredTopK`: no numba to load).
    """
    num_query, num_ref, k = size
    state = (CompiledTopK if compiled else FilteredTopK)(num_query, k, dynamic_threads())
    rank = _sampled_rank(k, num_ref, side) if order is not None else None
    walk = _Walk(scorer, state, rank, side, (symmetric, skip_diagonal), num_ref)
    walk.exclusion = exclusion
    with SearchProgress(_walked_pairs(num_query, num_ref, symmetric)) as walk.progress:
        if symmetric and state.threads > 1 and num_query > side:
            _walk_tiles_in_parallel(walk, (num_query, num_ref))
        elif (
            not symmetric
            and state.threads > 1
            and num_query > _row_block_height(num_query, side, state.threads)
        ):
            _walk_row_blocks_in_parallel(walk, (num_query, num_ref))
        else:
            walk.offer(_tiles(range(0, num_query, side), (num_query, num_ref), side, symmetric))
    short = torch.from_numpy(np.nonzero(state.count < k)[0])
    numbering = None if order is None else order.to(torch.int32).numpy()
    positions = order if symmetric else None
    values, indices = state.finish(numbering, positions)
    if len(short):
        rows_out = short if positions is None else positions[short]
        found = _search_whole_rows(scorer, short, (num_ref, k), side, skip_diagonal, exclusion)
        values[rows_out] = found[0]
        indices[rows_out] = found[1] if order is None else order[found[1]]
    return values, indices


def _walked_pairs(num_query: int, num_ref: int, symmetric: bool) -> int:
    """The pairs the walk scores: a symmetric one's tiles on one side of the diagonal
    (counted as square tiles) hold about half of them."""
    if not symmetric:
        return num_query * num_ref
    return num_query * (num_query + 1) // 2


class _Walk:
    """Computes tiles and offers them to the running top-k of their rows (and, below the
    diagonal of a symmetric walk, of their columns)."""

    def __init__(
        self,
        scorer: Scorer,
        state: CompiledTopK | FilteredTopK,
        rank: int | None,
        side: int,
        diagonal: tuple[bool, bool],
        num_ref: int,
    ) -> None:
        """``diagonal`` is ``(symmetric, skip_diagonal)``."""
        self.scorer, self.state, self.rank, self.side = scorer, state, rank, side
        self.symmetric, self.skip_diagonal = diagonal
        self.num_ref = num_ref
        self.in_blocks = not self.symmetric
        self.exclusion: Exclusion | None = None
        self.progress: SearchProgress | None = None
        self.sample: Sample | None = None  # sets first bounds apart from the tiles

    def buffer(self) -> torch.Tensor:
        """A buffer that holds a tile's products (a block's, in blocks)."""
        height = min(self.side, self.state.num_rows)
        if self.in_blocks:
            height = min(height, BLOCK_ROWS)
        return torch.empty(height * min(self.side, self.num_ref), dtype=torch.float32)

    def offer(self, tiles: list[tuple[slice, slice]], buffer: torch.Tensor | None = None) -> None:
        """Compute and offer ``tiles`` in order (a separate search's in blocks)."""
        buffer = self.buffer() if buffer is None else buffer
        if self.in_blocks:
            tiles = [block for tile in tiles for block in self._blocks(*tile)]
        for rows, cols in tiles:
            if self.sample is not None and cols.start == 0:
                self.first_bounds(rows, self.sample)
            scores = self.product(rows, cols, buffer)
            self.prepare(rows.start, cols.start, scores)
            self.push(rows.start, cols.start, scores)

    def product(self, rows: slice, cols: slice, buffer: torch.Tensor) -> torch.Tensor:
        """The scores of ``rows`` x ``cols``, computed into ``buffer``."""
        out = buffer[: _height(rows) * (cols.stop - cols.start)].view(_height(rows), -1)
        return self.scorer.tile(rows, cols, out)

    def _blocks(self, rows: slice, cols: slice) -> list[tuple[slice, slice]]:
        """The blocks of the tile ``rows`` x ``cols``, row block by row block; those of the
        sample span its whole width, so that each row's first bound sees all of it."""
        width = cols.stop - cols.start if self.is_sample(cols.start) else BLOCK_COLUMNS
        return [
            (slice(r, min(r + BLOCK_ROWS, rows.stop)), slice(c, min(c + width, cols.stop)))
            for r in range(rows.start, rows.stop, BLOCK_ROWS)
            for c in range(cols.start, cols.stop, width)
        ]

    def prepare(self, r0: int, c0: int, scores: torch.Tensor) -> None:
        """Leave out the diagonal of a self-search's scores; from the sample's, set the
        first bounds of their rows."""
        if self.skip_diagonal and r0 < c0 + scores.shape[1] and c0 < r0 + scores.shape[0]:
            scores.diagonal(offset=r0 - c0).fill_(torch.inf)
        if self.exclusion is not None:
            self.exclusion.fill_tile(scores, slice(r0, r0 + len(scores)), c0, torch.inf)
        if self.is_sample(c0) and self.rank is not None:  # the reordered sample
            rows = slice(r0, r0 + len(scores))
            self.state.bound[rows] = self.state.kth_smallest(scores, self.rank).numpy()

    def first_bounds(self, rows: slice, sample: Sample) -> None:
        """Set the first bounds of ``rows`` from their scores against the sample."""
        rank = self.rank
        assert rank is not None  # a walk with a sample has a rank
        scores = sample.scorer.picked(rows, slice(0, sample.size))
        if self.skip_diagonal:  # a row's own entry is no candidate
            own = sample.rows.unsqueeze(0) == torch.arange(rows.start, rows.stop).unsqueeze(1)
            scores[own] = torch.inf
        if self.exclusion is not None:  # nor are its excluded pairs
            block = self.exclusion.query_rows(rows.start, rows.stop)
            scores[block.excluded_at(sample.rows.expand(len(scores), -1))] = torch.inf
        self.state.bound[rows] = self.state.kth_smallest(scores, rank).numpy()

    def is_sample(self, c0: int) -> bool:
        """Whether scores from column ``c0`` on are the reordered sample's (or a block of
        it)."""
        return c0 == 0 and self.rank is not None and self.sample is None

    def push(self, r0: int, c0: int, scores: torch.Tensor) -> None:
        """Offer prepared scores to their rows and, below the diagonal tiles of a
        symmetric walk, to their columns' rows."""
        if self.symmetric and c0 != r0:
            self.state.push_both(r0, scores, c0)
        else:
            self.state.push_rows(r0, scores, c0)
        if self.progress is not None:
            self.progress.update(_tile_pairs(r0, c0, scores.shape, self.symmetric))


def _tile_pairs(r0: int, c0: int, shape: tuple[int, ...], symmetric: bool) -> int:
    """The pairs a tile adds to :func:`_walked_pairs`: a symmetric walk's diagonal tile
    counts its half, with the diagonal."""
    rows, cols = shape[0], shape[1]
    if symmetric and r0 == c0:
        return rows * (rows + 1) // 2
    return rows * cols


def _tiles(
    row_starts: range,
    size: tuple[int, int],
    side: int,
    symmetric: bool,
    height: int | None = None,
) -> list[tuple[slice, slice]]:
    """The tiles of the row blocks starting at ``row_starts``, row block by row block;
    ``size`` is ``(num_query, num_ref)``. A symmetric walk stops at the diagonal. Row
    blocks are ``height`` rows high (``side`` if None)."""
    num_query, num_ref = size
    height = side if height is None else height
    return [
        (slice(r0, min(r0 + height, num_query)), slice(c0, min(c0 + side, num_ref)))
        for r0 in row_starts
        for c0 in range(0, r0 + 1 if symmetric else num_ref, side)
    ]


def _walk_row_blocks_in_parallel(walk: _Walk, size: tuple[int, int]) -> None:
    """Each thread takes the next row block and computes and offers its tiles alone, with
    PyTorch on one thread meanwhile, until none is left.

    The row blocks of a separate search feed different rows, so the threads never wait
    for one another, and no OpenMP worker spins on a core between products (see
    :func:`_walk_tiles_in_parallel`).
    """
    num_query = size[0]
    height = _row_block_height(num_query, walk.side, walk.state.threads)
    blocks = iter(range(0, num_query, height))
    lock = threading.Lock()
    failed = threading.Event()  # the other threads stop at their next row block

    def work(part: int) -> None:
        buffer = walk.buffer()
        try:
            while not failed.is_set():
                with lock:
                    r0 = next(blocks, None)
                if r0 is None:
                    return
                walk.offer(_tiles(range(r0, r0 + 1), size, walk.side, False, height), buffer)
        except BaseException:
            failed.set()
            raise

    _alone_on_threads(walk, work, min(walk.state.threads, -(-num_query // height)))


def _row_block_height(num_query: int, side: int, threads: int) -> int:
    """Rows per row block of a separate search on ``threads`` threads: ``side``, or an
    equal share of fewer rows (at least ``MIN_THREAD_ROWS``), so that every thread works."""
    share = -(-num_query // threads)
    return min(side, max(MIN_THREAD_ROWS, share))


def _walk_tiles_in_parallel(walk: _Walk, size: tuple[int, int]) -> None:
    """A self-search on several threads: each thread takes a tile (one whose row blocks no
    other thread holds, if there is one) and computes and offers it alone, with PyTorch on
    one thread meanwhile, until none is left.

    Two threads never feed one row block at once: the second waits for the first's push.
    A row block's sample tile sets its rows' first bounds before any candidate reaches
    them: the block's other tiles, and the tiles that feed it through their columns, are
    handed out after that.

    After a product on several threads, PyTorch's OpenMP workers keep spinning for more
    work for a while (libgomp's default wait policy), on the cores that the top-k then
    needs; products on one thread each leave no worker to spin.
    """
    starts = range(0, size[0], walk.side)
    schedule = _Schedule(_tiles(starts, size, walk.side, True), walk)

    def work(part: int) -> None:
        buffer = walk.buffer()
        try:
            while (tile := schedule.take()) is not None:
                rows, cols = tile
                scores = walk.product(rows, cols, buffer)
                walk.prepare(rows.start, cols.start, scores)
                with schedule.feeding(tile):
                    walk.push(rows.start, cols.start, scores)
        except BaseException:
            schedule.stop()  # the other threads stop at their next tile
            raise

    _alone_on_threads(walk, work, walk.state.threads)


def _alone_on_threads(walk: _Walk, work: Callable[[int], None], parts: int) -> None:
    """``work(part)`` for ``parts`` parts at once, each doing its tiles' products and
    top-k alone: PyTorch and the walk's top-k on one thread meanwhile.

    PyTorch's thread count is per thread (OpenMP's), so each part sets its own thread's
    (:func:`_one_torch_thread`). Every part has ended when this returns, error or not
    (:func:`_in_parts`), before the state's thread count is restored.
    """

    def alone(part: int) -> None:
        with _one_torch_thread(), torch.no_grad():  # grad mode is per thread
            work(part)

    threads = walk.state.threads
    walk.state.threads = 1  # each tile's top-k runs on the thread that computed it
    try:
        _in_parts(alone, parts)
    finally:
        walk.state.threads = threads


class _Schedule:
    """Hands out the tiles of a symmetric walk to threads: no row is fed before its
    sample tile has set its bounds, and no two threads feed one row block at once."""

    def __init__(self, tiles: list[tuple[slice, slice]], walk: _Walk) -> None:
        self._pending = tiles
        self._walk = walk
        self._held: list[int] = []  # the row blocks of the tiles taken and not yet fed
        self._feeding: set[int] = set()  # row blocks being fed
        # Row blocks whose rows have their first bounds (all of them without a sample).
        self._bounded = {rows.start for rows, _ in tiles if walk.rank is None}
        self._stopped = False
        self._condition = threading.Condition()

    def take(self) -> tuple[slice, slice] | None:
        """The first tile left whose rows have their first bounds, preferring one whose
        row blocks no other thread holds; waits for one. None when all are taken or the
        walk was stopped."""
        with self._condition:
            while self._pending and not self._stopped:
                tile = self._first_allowed()
                if tile is not None:
                    self._pending.remove(tile)
                    self._held.extend(_blocks_of(tile))
                    return tile
                self._condition.wait()
            return None

    @contextlib.contextmanager
    def feeding(self, tile: tuple[slice, slice]) -> Iterator[None]:
        """Wait until no other thread feeds the tile's row blocks, then hold them while
        the block runs; the tile's rows have their first bounds by then."""
        blocks = _blocks_of(tile)
        with self._condition:
            self._condition.wait_for(lambda: not self._feeding.intersection(blocks))
            self._feeding.update(blocks)
            self._bounded.add(tile[0].start)  # set by the sample tile before it is fed
            self._condition.notify_all()
        try:
            yield
        finally:
            with self._condition:
                self._feeding.difference_update(blocks)
                for block in blocks:
                    self._held.remove(block)
                self._condition.notify_all()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def _bounds_set(self, rows: slice, cols: slice) -> bool:
        """Whether both row blocks have their first bounds, or this is the sample tile
        that sets the rows' bounds (and its columns' rows have theirs)."""
        if self._walk.is_sample(cols.start):
            return rows.start == cols.start or cols.start in self._bounded
        return rows.start in self._bounded and cols.start in self._bounded

    def _first_allowed(self) -> tuple[slice, slice] | None:
        """The first pending tile whose rows have their bounds and whose row blocks no
        other thread holds; else the first whose rows have their bounds; else None."""
        allowed = None
        for tile in self._pending:
            if self._bounds_set(*tile):
                if not self._held_by_others(tile):
                    return tile
                allowed = allowed or tile
        return allowed

    def _held_by_others(self, tile: tuple[slice, slice]) -> bool:
        return any(block in self._held for block in _blocks_of(tile))


def _blocks_of(tile: tuple[slice, slice]) -> tuple[int, ...]:
    """The row blocks (by first row) that a tile of a symmetric walk feeds."""
    rows, cols = tile
    return (rows.start,) if rows.start == cols.start else (rows.start, cols.start)


def _height(rows: slice) -> int:
    return rows.stop - rows.start


def _sampled_rank(k: int, num_ref: int, side: int) -> int | None:
    """Rank, among the ``side`` sampled scores, of a row's first bound; None when the
    sample says little (the first tile then sets the bound as any other)."""
    expected = k * side / num_ref
    rank = max(1, math.ceil(expected + SPREAD * math.sqrt(expected) + 1))
    return None if rank * 2 > side else rank


def _search_whole_rows(
    scorer: Scorer,
    rows: torch.Tensor,
    size: tuple[int, int],
    side: int,
    skip_diagonal: bool,
    exclusion: Exclusion | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(scores, indices)`` of the k smallest scores of ``rows``, from their whole
    rows. ``size`` is ``(num_ref, k)``."""
    num_ref, k = size
    step = max(1, side * side // max(num_ref, 1))
    every = slice(0, num_ref)
    parts = []
    for start in range(0, len(rows), step):
        part = rows[start : start + step]
        scores = scorer.picked(part, every)
        if skip_diagonal:
            scores[torch.arange(len(part)), part] = torch.inf
        if exclusion is not None:
            exclusion.fill(scores, part, torch.inf)
        parts.append(topk(scores, k, largest=False))
    return torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])
