"""Running top-k of score tiles in compiled loops (numba), for large CPU searches.

Each row keeps a buffer of candidates and a bound: at least k of its values seen so far lie
below the bound, so nothing at or above it can enter the row's top k. A tile is read once:
per ``BLOCK`` (8) consecutive entries of a row (or, for the rows fed by the tile's columns,
per 8 tile rows of a column) one vectorized minimum is compared with the bound, and only
blocks that beat it are opened. Their entries below the bound are appended to the buffer
without branches; a full buffer is cut back to its k smallest (quickselect), which tightens
the bound, as faiss's reservoirs do. A row without candidates takes its first bound from its
first tile: the k-th smallest block minimum (each is an entry of the row, so at least k
entries lie at or below it). A tile off the diagonal of a symmetric matrix can feed both
its rows and its columns in one pass (``push_both``): each block of 8 tile rows is read
from memory once, for the column minima and for its own rows.
Exact: only values that cannot be in the top k are ever dropped; ``finish`` sorts the rest,
so the result equals ``torch.topk`` up to the order of ties. Scores must not be NaN.

The loops release the GIL; rows (or columns) are split over ``torch.get_num_threads()``
Python threads. numba is optional: :func:`available` says whether it can be used.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from types import ModuleType
from typing import Any

import numpy as np
import torch

from ..._warnings import warn_external

__all__ = ["CompiledTopK", "available", "installed", "loaded"]

logger = logging.getLogger(__name__)

# Set to 1 to never use the compiled loops (the PyTorch paths serve every search).
DISABLE_ENV = "PML_DISABLE_NUMBA"
# Rows (or columns) below which a call is not split over threads.
MIN_PART = 64
# Rows per candidate buffer (the compiled search's tile side, so a tile feeds one buffer).
ROWS_PER_BUFFER = 2048
# Room past k in each candidate buffer: SLACK_BLOCKS blocks, or SLACK_FRACTION of k if more.
# A full buffer is cut back to its k best, so a small room tightens the bound often and
# leaves little for ``finish``; but each cut costs a quickselect over the whole buffer, so
# the room grows with k (k=550: about 830 entries cost 4.8 s against 7.8 s with k + 64).
SLACK_BLOCKS = 8
SLACK_FRACTION = 0.5
# Keys the load check sorts with the radix sort of the final sort.
RADIX_TRY_KEYS = 100


def available() -> bool:
    """Whether numba is importable and the compiled loops are not disabled (imports numba)."""
    return _enabled() and _kernels() is not None


def installed() -> bool:
    """Whether numba is installed and the compiled loops are not disabled, without
    importing numba (about a second, once per process, with its first compiled call)."""
    return _enabled() and importlib.util.find_spec("numba") is not None


def loaded() -> bool:
    """Whether this process has used the compiled loops already (numba is loaded)."""
    return _enabled() and _used


def _enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") != "1"


_used = False
# What the finish loop takes for no renaming and for rows written in place.
_NONE_INT32 = np.empty(0, dtype=np.int32)
_NONE_INT64 = np.empty(0, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def _kernels() -> ModuleType | None:
    """The compiled loops, each loaded and tried once; None (with a warning if numba is
    installed) when they cannot be used, so that searches keep the PyTorch paths."""
    try:
        _use_a_writable_cache()
        from . import _topk_kernels

        _try_out(_topk_kernels)
    except Exception as error:  # a broken numba or llvmlite, or loops it cannot compile
        if importlib.util.find_spec("numba") is not None:
            warn_external(
                f"The compiled top-k loops (numba) could not be used ({type(error).__name__}: "
                f"{error}); exact CPU searches keep the PyTorch paths, which find the same "
                f"neighbours more slowly. Set {DISABLE_ENV}=1 to skip numba.",
                RuntimeWarning,
            )
        return None
    return _topk_kernels


def _use_a_writable_cache() -> None:
    """Make sure numba can cache the compiled loops, so that only a process's first
    compilation ever pays for it (seconds) and the others load them (a fraction of one).

    numba caches next to the module (``__pycache__``) where it can write, else in the
    user's cache folder (``~/.cache/numba`` or ``$XDG_CACHE_HOME/numba``), which serves an
    install into a read-only site-packages; ``NUMBA_CACHE_DIR`` overrides both. Where none
    of them can be written, the cache goes to ``pml-numba-<uid>`` in the temporary folder
    (without any, numba would refuse to load the loops).
    """
    import numba
    from numba.misc.appdirs import AppDirs

    config: Any = numba.config  # set from the environment when numba is imported
    if config.CACHE_DIR:
        return
    here = os.path.join(os.path.dirname(__file__), "__pycache__")
    user = AppDirs(appname="numba", appauthor=False).user_cache_dir
    if not (_writable(here) or _writable(user)):
        fallback = os.path.join(tempfile.gettempdir(), f"pml-numba-{os.getuid()}")
        logger.info("numba cannot cache in %s or %s; caching in %s", here, user, fallback)
        config.CACHE_DIR = fallback


def _writable(folder: str) -> bool:
    """Whether ``folder`` exists or can be made, and a file can be written in it (as numba
    checks it)."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _try_out(kernels: Any) -> None:
    """Run every loop on a small tile, as the searches call them, and check the top-k.

    Loads (or compiles) each loop now, not in the middle of a search.
    """
    k, size = 2, 3 * kernels.BLOCK
    tile = np.random.default_rng(0).permutation(size * size).astype(np.float32)
    tile = tile.reshape(size, size)
    # Row r < size sees tile row r twice and tile column r; row size + c sees tile column c.
    seen = np.concatenate([tile, tile.T, tile], axis=1)
    expected = np.concatenate([np.sort(seen, axis=1)[:, :k], np.sort(tile.T, axis=1)[:, :k]])
    right = (
        np.array_equal(_fed_top_k(kernels, tile, k), expected)
        and all(  # a small rank (by insertion) and a large one (by quickselect)
            np.array_equal(_kth_smallest(kernels, seen, rank), np.sort(seen, axis=1)[:, rank - 1])
            for rank in (k, kernels.INSERTION_MAX_K + 1)
        )
        and _radix_sorts(kernels)
    )
    if not right:
        raise RuntimeError("they returned a wrong top-k on a test tile")


def _fed_top_k(kernels: Any, tile: np.ndarray, k: int) -> np.ndarray:
    """The k smallest values of rows fed ``tile`` by every push loop, from ``finish``."""
    size = len(tile)
    capacity = k + kernels.BLOCK * SLACK_BLOCKS
    values = np.empty((2 * size, capacity), dtype=np.float32)
    indices = np.empty((2 * size, capacity), dtype=np.int32)
    count = np.zeros(2 * size, dtype=np.int64)
    bound = np.full(2 * size, np.inf, dtype=np.float32)
    kernels.push_rows(tile, values, indices, count, bound, k, 0, 0, 0, size)
    kernels.push_columns(tile, values, indices, count, bound, k, 0, size, 0, size)
    state = (values, indices, count, bound)
    kernels.push_both(tile, state, state, k, (0, size), (size, 0), (0, size), (0, size), True)
    out = (np.empty((2 * size, k), dtype=np.float32), np.empty((2 * size, k), dtype=np.int64))
    kernels.finish(values, indices, count, k, _NONE_INT32, _NONE_INT64, *out, 0, 2 * size)
    return out[0]


def _kth_smallest(kernels: Any, tile: np.ndarray, k: int) -> np.ndarray:
    out = np.empty(len(tile), dtype=np.float32)
    kernels.kth_smallest_rows(tile, k, out, 0, len(tile))
    return out


def _radix_sorts(kernels: Any) -> bool:
    """Whether the final sort's radix sort sorts keys with shared and differing bytes."""
    keys = np.random.default_rng(0).integers(0, 2**63, RADIX_TRY_KEYS, dtype=np.uint64)
    keys &= np.uint64(0xFF00FFFF00FF00FF)  # bytes that all keys share (zero) and others
    radix_sorted = keys.copy()
    spare = np.empty_like(keys)
    kernels._radix_sort(radix_sorted, len(keys), spare, np.empty((8, 256), dtype=np.int64))
    return bool(np.array_equal(radix_sorted, np.sort(keys)))


class CompiledTopK:
    """The k smallest float32 candidates per row, fed tile by tile.

    Candidates are kept in buffers of ``ROWS_PER_BUFFER`` rows, which ``finish`` releases
    one by one as it writes the outputs, so the two are hardly ever held in full at once.

    Example:
        >>> state = CompiledTopK(num_rows=1, k=2)
        >>> state.push_rows(0, torch.tensor([[3.0, 1.0, 0.5, 9.0]]), first_index=0)
        >>> values, indices = state.finish()
        >>> values.tolist(), indices.tolist()
        ([[0.5, 1.0]], [[2, 1]])
    """

    def __init__(self, num_rows: int, k: int, threads: int | None = None) -> None:
        kernels = _kernels()
        if kernels is None:
            raise ModuleNotFoundError("CompiledTopK needs numba: pip install numba")
        global _used
        _used = True
        self._kernels: Any = kernels
        self.k = k
        self.num_rows = num_rows
        block = kernels.BLOCK
        room = max(SLACK_BLOCKS, -(-int(k * SLACK_FRACTION) // block))
        capacity = k + room * block  # a whole block always fits after a cut
        self._buffers: list[tuple[np.ndarray, np.ndarray] | None] = [
            (
                np.empty((min(ROWS_PER_BUFFER, num_rows - first), capacity), dtype=np.float32),
                np.empty((min(ROWS_PER_BUFFER, num_rows - first), capacity), dtype=np.int32),
            )
            for first in range(0, num_rows, ROWS_PER_BUFFER)
        ]
        self.count = np.zeros(num_rows, dtype=np.int64)
        self.bound = np.full(num_rows, np.inf, dtype=np.float32)
        self.threads = max(1, threads if threads is not None else torch.get_num_threads())

    def push_rows(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + c`` of row ``first_row + r``."""
        tile = _as_array(scores)
        self._push(self._kernels.push_rows, tile, len(tile), first_row, first_index)

    def push_columns(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + r`` of row ``first_row + c``."""
        tile = _as_array(scores)
        self._push(self._kernels.push_columns, tile, tile.shape[1], first_row, first_index)

    def push_both(self, first_row: int, scores: torch.Tensor, first_column: int) -> None:
        """Offer a tile of a symmetric matrix (rows and candidates numbered alike) through
        its rows and its columns: ``scores[r, c]`` as candidate ``first_column + c`` of row
        ``first_row + r`` and as candidate ``first_row + r`` of row ``first_column + c``.

        Same as ``push_rows`` then ``push_columns``, but each block of tile rows is read
        once for both. The tile's rows and columns must feed different rows.
        """
        tile = _as_array(scores)
        height, width = tile.shape
        if first_row < first_column + width and first_column < first_row + height:
            raise ValueError("push_both takes a tile off the diagonal")
        rows = self._state(first_row, height)
        columns = self._state(first_column, width)
        if rows is None or columns is None:  # a buffer edge inside the tile
            self.push_rows(first_row, scores, first_column)
            self.push_columns(first_column, scores, first_row)
            return
        state = (rows[0], columns[0], self.k, (rows[1], columns[1]), (first_column, first_row))
        parts = min(self.threads, max(1, height // MIN_PART), max(1, width // MIN_PART))
        row_edges = [height * part // parts for part in range(parts + 1)]
        column_edges = [width * part // parts for part in range(parts + 1)]
        _in_parts(
            functools.partial(
                _push_both_part, self._kernels.push_both, tile, state, row_edges, column_edges
            ),
            parts,
        )

    def finish(
        self, numbering: np.ndarray | None = None, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(values, indices)`` of each row's k smallest candidates, sorted by value
        and, among equal values, by index.

        ``numbering`` (int32) renames candidate ``i`` to ``numbering[i]`` before the sort;
        ``positions`` puts row ``r`` at output row ``positions[r]``. The state is released:
        a finished ``CompiledTopK`` takes no more candidates.
        """
        values = torch.empty((self.num_rows, self.k), dtype=torch.float32)
        indices = torch.empty((self.num_rows, self.k), dtype=torch.long)
        names = _NONE_INT32 if numbering is None else numbering
        for number, buffer in enumerate(self._buffers):
            if buffer is None:
                raise RuntimeError("CompiledTopK.finish was called twice")
            rows = slice(number * ROWS_PER_BUFFER, number * ROWS_PER_BUFFER + len(buffer[0]))
            if positions is None:
                out_rows, out = _NONE_INT64, (values[rows].numpy(), indices[rows].numpy())
            else:
                out_rows, out = positions[rows].numpy(), (values.numpy(), indices.numpy())
            state = (*buffer, self.count[rows], self.k, names, out_rows, *out)
            self._map(0, len(buffer[0]), self._kernels.finish, *state)
            self._buffers[number] = None  # released before the next rows are written
        return values, indices

    def kth_smallest(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """The k-th smallest entry of each row of ``scores``."""
        tile = _as_array(scores)
        if not 1 <= k <= tile.shape[1]:
            raise ValueError(f"kth_smallest needs 1 <= k <= {tile.shape[1]}; got k={k}")
        out = np.empty(len(tile), dtype=np.float32)
        self._map(0, len(tile), self._kernels.kth_smallest_rows, tile, k, out)
        return torch.from_numpy(out)

    def _state(self, first_row: int, size: int) -> tuple[tuple[Any, ...], int] | None:
        """``((values, indices, count, bound), offset)`` of the buffer that holds rows
        ``first_row:first_row + size``; None if they span two."""
        number = first_row // ROWS_PER_BUFFER
        state = self._buffer_state(number)
        base = number * ROWS_PER_BUFFER
        if first_row + size > base + len(state[0]):
            return None
        return state, first_row - base

    def _buffer_state(self, number: int) -> tuple[np.ndarray, ...]:
        """``(values, indices, count, bound)`` of candidate buffer ``number``."""
        buffer = self._buffers[number]
        if buffer is None:
            raise RuntimeError("a finished CompiledTopK takes no more candidates")
        base = number * ROWS_PER_BUFFER
        rows = slice(base, base + len(buffer[0]))
        return (*buffer, self.count[rows], self.bound[rows])

    def _push(self, kernel: Any, tile: np.ndarray, size: int, first_row: int, first: int) -> None:
        """Run ``kernel`` on the tile's rows (or columns) ``0:size``, which feed rows
        ``first_row:first_row + size``, one candidate buffer at a time."""
        for number in range(first_row // ROWS_PER_BUFFER, _ceil_div(first_row + size)):
            state = self._buffer_state(number)
            base = number * ROWS_PER_BUFFER
            low = max(0, base - first_row)
            high = min(size, base + len(state[0]) - first_row)
            self._map(low, high, kernel, tile, *state, self.k, first_row - base, first)

    def _map(self, low: int, high: int, kernel: Any, *args: Any) -> None:
        """``kernel(*args, a, b)`` over the parts ``a:b`` of ``low:high``, split over the
        threads."""
        parts = min(self.threads, max(1, (high - low) // MIN_PART))
        edges = [low + (high - low) * part // parts for part in range(parts + 1)]
        _in_parts(lambda part: kernel(*args, edges[part], edges[part + 1]), parts)


def _in_parts(work: Any, parts: int) -> None:
    """``work(part)`` for every part, part 0 on this thread and the others on the pool.

    Returns only once every part has ended, with the first error if one failed (parts
    not yet started are cancelled then): the caller then restores what it changed for
    the parts (a state's thread count, PyTorch's), and no part outlives it. On a pool
    thread the parts run one after the other on that thread: a task that waited for
    tasks queued behind it on the pools would wait forever (no pool thread ever waits
    for another pool task).
    """
    if parts == 1 or _on_pool.flag:
        for part in range(parts):
            work(part)
        return
    pool = _pool(parts - 1, os.getpid())
    futures = [pool.submit(work, part) for part in range(1, parts)]
    try:
        work(0)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    finally:
        wait(futures)
    for future in futures:
        future.result()


def _push_both_part(
    kernel: Any,
    tile: np.ndarray,
    state: tuple[Any, ...],
    rows: list[int],
    columns: list[int],
    part: int,
) -> None:
    """Part ``part`` of a symmetric tile: its rows through the whole width and, for its
    columns, every row; no other part touches the same rows' candidates."""
    own = (columns[part], columns[part + 1])
    kernel(tile, *state, (rows[part], rows[part + 1]), own, True)
    for other in range(len(rows) - 1):
        if other != part:
            kernel(tile, *state, (rows[other], rows[other + 1]), own, False)


def _ceil_div(rows: int) -> int:
    return -(-rows // ROWS_PER_BUFFER)


class _PoolThread(threading.local):
    """Whether the current thread is a worker of the pools."""

    flag = False


_on_pool = _PoolThread()


def _mark_pool_thread() -> None:
    _on_pool.flag = True


@functools.lru_cache(maxsize=4)
def _pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """Worker threads for the loops, idle between searches; a forked child (which has
    none of its parent's threads) gets its own."""
    return ThreadPoolExecutor(threads, thread_name_prefix="pml-topk", initializer=_mark_pool_thread)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.cache_clear)


def _as_array(scores: torch.Tensor) -> np.ndarray:
    if scores.dtype != torch.float32 or scores.device.type != "cpu":
        raise TypeError("CompiledTopK takes float32 CPU scores")
    return scores.contiguous().numpy()
