"""Running top-k of score tiles in compiled loops (numba), for large CPU searches.

Each row keeps a buffer of candidates and a bound: at least k of its values seen so far lie
below the bound, so nothing at or above it can enter the row's top k. A tile is read once:
per 16 consecutive entries of a row (or, for the rows fed by the tile's columns, per 16
tile rows of a column) one vectorized minimum is compared with the bound, and only
blocks that beat it are opened. Their entries below the bound are appended to the buffer
without branches; a full buffer is cut back to its k smallest (quickselect), which tightens
the bound, as faiss's reservoirs do. A row without candidates takes its first bound from its
first tile: the k-th smallest block minimum (each is an entry of the row, so at least k
entries lie at or below it).
Exact: only values that cannot be in the top k are ever dropped; ``finish`` sorts the rest,
so the result equals ``torch.topk`` up to the order of ties. Scores must not be NaN.

The loops release the GIL; rows (or columns) are split over ``torch.get_num_threads()``
Python threads. numba is optional: :func:`available` says whether it can be used.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np
import torch

__all__ = ["CompiledTopK", "available", "installed", "loaded"]

# Set to 1 to never use the compiled loops (the PyTorch paths serve every search).
DISABLE_ENV = "PML_DISABLE_NUMBA"
# Rows (or columns) below which a call is not split over threads.
MIN_PART = 64


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


@functools.lru_cache(maxsize=1)
def _kernels() -> ModuleType | None:
    try:
        from . import _topk_kernels
    except ImportError:
        return None
    return _topk_kernels


class CompiledTopK:
    """The k smallest float32 candidates per row, fed tile by tile.

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
        capacity = 2 * k + 4 * kernels.BLOCK  # room to append a whole block past k
        self.values = np.empty((num_rows, capacity), dtype=np.float32)
        self.indices = np.empty((num_rows, capacity), dtype=np.int32)
        self.count = np.zeros(num_rows, dtype=np.int64)
        self.bound = np.full(num_rows, np.inf, dtype=np.float32)
        self.threads = max(1, threads if threads is not None else torch.get_num_threads())

    def push_rows(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + c`` of row ``first_row + r``."""
        tile = _as_array(scores)
        self._split(len(tile), self._kernels.push_rows, tile, first_row, first_index)

    def push_columns(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + r`` of row ``first_row + c``."""
        tile = _as_array(scores)
        self._split(tile.shape[1], self._kernels.push_columns, tile, first_row, first_index)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(values, indices)`` of each row's k smallest candidates, sorted by value
        and, among equal values, by index.

        The state is released: a finished ``CompiledTopK`` takes no more candidates.
        """
        num_rows = len(self.values)
        values = torch.empty((num_rows, self.k), dtype=torch.float32)
        indices = torch.empty((num_rows, self.k), dtype=torch.long)
        out = (values.numpy(), indices.numpy())
        state = (self.values, self.indices, self.count, self.k)
        self._map(num_rows, lambda start, stop: self._kernels.finish(*state, *out, start, stop))
        self.values = self.indices = np.empty((0, 0), dtype=np.float32)
        return values, indices

    def kth_smallest(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """The k-th smallest entry of each row of ``scores``."""
        tile = _as_array(scores)
        out = np.empty(len(tile), dtype=np.float32)
        self._map(
            len(tile),
            lambda start, stop: self._kernels.kth_smallest_rows(tile, k, out, start, stop),
        )
        return torch.from_numpy(out)

    def _split(self, size: int, kernel: Any, tile: np.ndarray, first_row: int, first: int) -> None:
        state = (self.values, self.indices, self.count, self.bound, self.k)
        self._map(size, lambda start, stop: kernel(tile, *state, first_row, first, start, stop))

    def _map(self, size: int, work: Any) -> None:
        parts = min(self.threads, max(1, size // MIN_PART))
        if parts == 1:
            work(0, size)
            return
        edges = [size * part // parts for part in range(parts + 1)]
        pool = _pool(parts - 1, os.getpid())
        futures = [pool.submit(work, a, b) for a, b in zip(edges[1:-1], edges[2:])]
        work(0, edges[1])
        for future in futures:
            future.result()


@functools.lru_cache(maxsize=4)
def _pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """Worker threads for the loops, idle between searches; a forked child gets its own."""
    return ThreadPoolExecutor(threads, thread_name_prefix="pml-topk")


def _as_array(scores: torch.Tensor) -> np.ndarray:
    if scores.dtype != torch.float32 or scores.device.type != "cpu":
        raise TypeError("CompiledTopK takes float32 CPU scores")
    return scores.contiguous().numpy()
