"""A stand-in for hnswlib, so the docs' worked plugin example runs without it installed.

It implements the subset of hnswlib's ``Index`` that docs/plugins.md uses, with hnswlib's
signatures, dtypes and distances ('l2': squared Euclidean, 'ip': 1 - inner product,
'cosine': 1 - cosine similarity), but searches exactly. tests/test_docs.py puts this folder
at the *end* of ``sys.path``: an installed hnswlib is always preferred.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Index"]


class Index:
    """An exact "index" with hnswlib's method names and error for too large a k."""

    def __init__(self, space: str, dim: int) -> None:
        if space not in ("l2", "ip", "cosine"):
            raise RuntimeError(f"Space name must be one of l2, ip, or cosine. Got {space}")
        self.space, self.dim = space, dim
        self.ef, self.num_threads, self.max_elements = 10, -1, 0
        self._data = np.empty((0, dim), dtype=np.float32)
        self._ids = np.empty(0, dtype=np.uint64)

    def init_index(
        self,
        max_elements: int,
        M: int = 16,  # noqa: N803 (hnswlib's name)
        ef_construction: int = 200,
        random_seed: int = 100,
        allow_replace_deleted: bool = False,
    ) -> None:
        self.max_elements = max_elements

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def set_num_threads(self, num_threads: int) -> None:
        self.num_threads = num_threads

    def get_current_count(self) -> int:
        return len(self._data)

    def add_items(
        self, data: Any, ids: Any = None, num_threads: int = -1, replace_deleted: bool = False
    ) -> None:
        data = self._rows(data)
        if len(self._data) + len(data) > self.max_elements:
            raise RuntimeError("The number of elements exceeds the specified limit")
        if ids is None:
            ids = np.arange(len(self._data), len(self._data) + len(data))
        self._data = np.concatenate([self._data, data])
        self._ids = np.concatenate([self._ids, np.asarray(ids, dtype=np.uint64)])

    def knn_query(
        self, data: Any, k: int = 1, num_threads: int = -1, filter: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        query = self._rows(data)
        if k > len(self._data):
            raise RuntimeError(
                "Cannot return the results in a contiguous 2D array. Probably ef or M is too small"
            )
        distances = self._distances(query)
        order = np.argsort(distances, axis=1, kind="stable")[:, :k]
        found = np.take_along_axis(distances, order, axis=1)
        return self._ids[order], found.astype(np.float32)

    def _rows(self, data: Any) -> np.ndarray:
        rows = np.asarray(data, dtype=np.float32).reshape(-1, self.dim)
        if self.space == "cosine":
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.where(norms > 0, norms, 1)
        return rows

    def _distances(self, query: np.ndarray) -> np.ndarray:
        if self.space == "l2":
            return ((query[:, None, :] - self._data[None, :, :]) ** 2).sum(axis=2)
        return 1 - query @ self._data.T
