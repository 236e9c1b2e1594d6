"""k-NN backends that each make one mistake a plugin author makes (issue 32).

Each takes the registry's ``distance`` option (a distance object) as a plugin does, and
passes every *form* check (shape, dtype, order of its own values, distinct indices): only
the content checks can see what is wrong. The brute force here is a plain matrix and
``topk``, independent of the library's search engine. tests/cli copies this file into
fake installed distributions, so it imports nothing from the tests.
"""

from __future__ import annotations

from typing import Any

import torch

from pytorch_metric_learning.distances import BaseDistance, LpDistance


def _available(query: torch.Tensor, reference: Any, self_search: bool) -> int:
    return len(query if reference is None else reference) - int(self_search)


def _exact(
    distance: BaseDistance, query: torch.Tensor, k: int, reference: Any, self_search: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    reference = query if reference is None else reference
    values = distance(query, reference)
    if self_search:
        rows = torch.arange(len(query))
        values[rows, rows] = -float("inf") if distance.is_inverted else float("inf")
    return values.topk(k, dim=1, largest=distance.is_inverted)


class _Plugin:
    """Keeps its distance privately (``_distance``) as many plugins do."""

    def __init__(self, distance: BaseDistance | None = None) -> None:
        self._distance = distance or LpDistance(normalize_embeddings=False)


class AscendingSimilarities(_Plugin):
    """Sorts whatever its distance gives ascending: similarities come least similar first."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        reference = query if reference is None else reference
        values = self._distance(query, reference)
        if ref_includes_query:
            rows = torch.arange(len(query))
            values[rows, rows] = float("inf")
        return values.topk(k, dim=1, largest=False)


class SortedCopyIndices(_Plugin):
    """Searches a copy of the reference sorted by its first column; returns its positions."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        reference = query if reference is None else reference
        order = reference[:, 0].argsort()
        distances, indices = _exact(self._distance, query, k, reference, ref_includes_query)
        return distances, order.argsort()[indices]


class WrongMetric(_Plugin):
    """Searches squared Euclidean whatever it was configured with."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        squared = LpDistance(normalize_embeddings=False, power=2)
        return _exact(squared, query, k, reference, ref_includes_query)


class UndeclaredApproximate(_Plugin):
    """Misses each query's nearest neighbour (an HNSW graph would miss some) without saying
    it is approximate."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        if k == _available(query, reference, ref_includes_query):  # nothing to miss
            return _exact(self._distance, query, k, reference, ref_includes_query)
        distances, indices = _exact(self._distance, query, k + 1, reference, ref_includes_query)
        return distances[:, 1:].contiguous(), indices[:, 1:].contiguous()


class DeclaredApproximate(UndeclaredApproximate):
    """The same misses, declared: ``is_exact = False``."""

    is_exact = False


class ThreadedApproximate(_Plugin):
    """Declared approximate, but each call misses different rows (an HNSW index built on
    all threads): the same search gives different neighbours."""

    is_exact = False

    def __init__(self, distance: BaseDistance | None = None) -> None:
        super().__init__(distance)
        self.distance = self._distance  # declares its order (is_inverted) through it
        self.calls = 0

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls += 1
        if k == _available(query, reference, ref_includes_query):  # nothing to miss
            return _exact(self._distance, query, k, reference, ref_includes_query)
        distances, indices = _exact(self._distance, query, k + 1, reference, ref_includes_query)
        missed = (torch.arange(len(query)) + self.calls) % 7 == 0  # rows miss their nearest
        keep = torch.where(missed.unsqueeze(1), indices[:, 1:], indices[:, :-1])
        values = torch.where(missed.unsqueeze(1), distances[:, 1:], distances[:, :-1])
        return values.contiguous(), keep.contiguous()


class ModifiesInputs(_Plugin):
    """Normalizes the caller's query in place (through a NumPy view: no version bump)."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        array = query.numpy()
        array /= (array**2).sum(axis=1, keepdims=True) ** 0.5
        return _exact(self._distance, query, k, reference, ref_includes_query)


class RaisesInSearch(_Plugin):
    """Its own library fails during the search."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        raise RuntimeError("HNSW graph corrupted")


class UsearchPadding(_Plugin):
    """usearch's padding: index 0 and a NaN distance where fewer than k were found."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        distances, indices = _exact(self._distance, query, k, reference, ref_includes_query)
        distances[:, -1], indices[:, -1] = float("nan"), 0
        return distances, indices


class PynndescentPadding(_Plugin):
    """pynndescent's padding: index -1 and an infinite distance."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        distances, indices = _exact(self._distance, query, k, reference, ref_includes_query)
        distances[:, -1], indices[:, -1] = float("inf"), -1
        return distances, indices
