"""Excluded pairs are left out inside every search path, exactly, in linear memory.

The oracle builds the dense exclusion mask by plain loops over the rules (fine at test
sizes) and sorts each row's candidates by (distance, index) in float64, exact on
small-integer embeddings.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_knn_ties import _force

from pytorch_metric_learning.distances import DotProductSimilarity, LpDistance
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation.search import CustomKNN
from pytorch_metric_learning.evaluation.search._excluded_search import search_excluding
from pytorch_metric_learning.evaluation.search.exclusion import Exclusion

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")
compiled_module = importlib.import_module(
    "pytorch_metric_learning.evaluation.search._compiled_search"
)

EXACT = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    DotProductSimilarity(normalize_embeddings=False),
    LpDistance(normalize_embeddings=False, p=1),  # no matrix-product scorer: generic path
]
PATHS = ["rows", "compiled", "small tiles"]


def dense_mask(num_query, num_reference, rules):
    """The excluded pairs, one by one, from the rules' definitions."""
    query_keys, reference_keys, pairs, junk = rules
    mask = np.zeros((num_query, num_reference), dtype=bool)
    for q in range(num_query):
        for j in range(num_reference):
            if query_keys is not None and query_keys[q] == reference_keys[j]:
                mask[q, j] = True
            if junk is not None and junk[j]:
                mask[q, j] = True
    for q, j in pairs if pairs is not None else []:
        mask[q, j] = True
    return mask


def oracle(query, reference, distance, k, mask):
    """Each row's first k candidates by (distance, index); fewer when it has fewer."""
    query, reference = query.double().numpy(), reference.double().numpy()
    rows = []
    for q, point in enumerate(query):
        if isinstance(distance, LpDistance):
            values = (np.abs(reference - point) ** distance.p).sum(1) ** (
                distance.power / distance.p
            )
        else:
            values = reference @ point
        key = -values if distance.is_inverted else values
        candidates = [j for j in range(len(reference)) if not mask[q, j]]
        rows.append(sorted(candidates, key=lambda j: key[j])[:k])
    return rows


def force_path(patch: pytest.MonkeyPatch, path: str) -> None:
    """Whole-row blocks, compiled tiles of 32 (computed in 8 x 12 blocks), or tiny tiles."""
    tile_bytes = 256 if path == "small tiles" else knn_module.TILE_BYTES
    _force(patch, "compiled" if path == "compiled" else "rows", tile_bytes)
    patch.setattr(compiled_module, "BLOCK_ROWS", 8)
    patch.setattr(compiled_module, "BLOCK_COLUMNS", 12)


@st.composite
def problems(draw):
    """Integer points (many exact ties), keys, explicit pairs and junk references."""
    num_query = draw(st.integers(1, 30))
    num_reference = draw(st.integers(1, 50))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    query = torch.randint(-3, 4, (num_query, 3), generator=generator).float()
    reference = torch.randint(-3, 4, (num_reference, 3), generator=generator).float()
    keys = draw(st.booleans())
    query_keys = torch.randint(0, 4, (num_query,), generator=generator) if keys else None
    reference_keys = torch.randint(0, 4, (num_reference,), generator=generator) if keys else None
    num_pairs = draw(st.integers(0, 20))
    pairs = torch.stack(
        [
            torch.randint(0, num_query, (num_pairs,), generator=generator),
            torch.randint(0, num_reference, (num_pairs,), generator=generator),
        ],
        dim=1,
    )
    junk = torch.rand(num_reference, generator=generator) < draw(st.sampled_from([0.0, 0.2]))
    k = draw(st.integers(1, num_reference))
    return query, reference, (query_keys, reference_keys, pairs, junk), k


def exclusion_of(num_query, num_reference, rules):
    query_keys, reference_keys, pairs, junk = rules
    same = [] if query_keys is None else [(query_keys, reference_keys)]
    return Exclusion(num_query, num_reference, same_keys=same, pairs=pairs, never_candidates=junk)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    problem=problems(), distance_index=st.integers(0, len(EXACT) - 1), path=st.sampled_from(PATHS)
)
def test_search_leaves_out_exactly_the_excluded_pairs(problem, distance_index, path) -> None:
    query, reference, rules, k = problem
    distance = EXACT[distance_index]
    mask = dense_mask(len(query), len(reference), rules)
    expected = oracle(query, reference, distance, k, mask)
    exclusion = exclusion_of(len(query), len(reference), rules)
    with pytest.MonkeyPatch.context() as patch:
        force_path(patch, path)
        _, indices, valid = search_excluding(CustomKNN(distance), query, k, reference, exclusion)
    for row, want in enumerate(expected):
        assert indices[row][valid[row]].tolist() == want
        assert int(valid[row].sum()) == len(want)


class PlainKNN:
    """A third-party backend that knows nothing of exclusions (brute force)."""

    def __init__(self) -> None:
        self.inner = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
        self.calls: list[int] = []

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls.append(k)
        return self.inner(query, k, reference, ref_includes_query)


@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_backend_without_exclusion_searches_wider_and_filters(problem) -> None:
    query, reference, rules, k = problem
    mask = dense_mask(len(query), len(reference), rules)
    expected = oracle(query, reference, EXACT[0], k, mask)
    exclusion = exclusion_of(len(query), len(reference), rules)
    backend = PlainKNN()
    _, indices, valid = search_excluding(backend, query, k, reference, exclusion)
    for row, want in enumerate(expected):
        assert indices[row][valid[row]].tolist() == want
    assert all(width <= len(reference) for width in backend.calls)


def test_backend_without_exclusion_doubles_until_every_query_has_k() -> None:
    """Junk references count toward the first width; explicit pairs beyond it grow it."""
    query = torch.zeros(2, 1)
    reference = torch.arange(40, dtype=torch.float32).unsqueeze(1)
    backend = PlainKNN()
    exclusion = Exclusion(2, 40, pairs=torch.tensor([[0, j] for j in range(10)]))
    _, indices, valid = search_excluding(backend, query, 3, reference, exclusion)
    assert indices.tolist() == [[10, 11, 12], [0, 1, 2]]
    assert bool(valid.all())
    assert backend.calls == [13]


@settings(max_examples=40, deadline=None)
@given(problem=problems(), path=st.sampled_from(PATHS))
def test_excluding_nothing_equals_the_plain_search(problem, path) -> None:
    query, reference, _, k = problem
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.MonkeyPatch.context() as patch:
        force_path(patch, path)
        plain = knn(query, k, reference)
        excluded = knn(query, k, reference, exclusion=Exclusion(len(query), len(reference)))
    assert torch.equal(plain[1], excluded[1])
    assert torch.equal(plain[0], excluded[0])


def test_self_matches_fold_into_the_exclusion() -> None:
    """ref_includes_query with an exclusion: the query's own row is one more rule."""
    points = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    rule = Exclusion(2, 4, pairs=torch.tensor([[0, 1]]))
    _, indices = knn(points[:2], 2, points, True, exclusion=rule)
    assert indices.tolist() == [[2, 3], [0, 2]]


def test_exclusion_of_the_wrong_size_is_refused() -> None:
    knn = CustomKNN(LpDistance())
    with pytest.raises(InvalidArgumentError, match="'exclusion'.*3 queries and 4 references"):
        knn(torch.zeros(3, 2), 1, torch.zeros(4, 2), exclusion=Exclusion(3, 5))


def test_bad_pairs_are_refused_with_the_argument_named() -> None:
    with pytest.raises(InvalidArgumentError, match="'pairs'.*reference indices in \\[0, 4\\)"):
        Exclusion(2, 4, pairs=torch.tensor([[0, 4]]))
    with pytest.raises(InvalidArgumentError, match="'pairs'.*\\(m, 2\\) integer"):
        Exclusion(2, 4, pairs=torch.tensor([[0.0, 1.0]]))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["rows", "compiled"])
def test_no_dense_mask_is_allocated(path) -> None:
    """Memory stays linear: no single allocation during the excluded search comes near a
    query-by-reference mask (measured by the profiler's per-operator allocations)."""
    num = 3000
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(num, 8, generator=generator)
    labels = torch.arange(num) // 5
    cameras = torch.arange(num) % 3
    rule = Exclusion(num, num, same_keys=[(labels * 3 + cameras, labels * 3 + cameras)])
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.MonkeyPatch.context() as patch:
        force_path(patch, path)
        patch.setattr(knn_module, "TILE_BYTES", 2**16)
        patch.setattr(knn_module, "MIN_BLOCK_ROWS", 1)
        patch.setattr(compiled_module, "BLOCK_ROWS", 256)  # few blocks: few profiled ops
        patch.setattr(compiled_module, "BLOCK_COLUMNS", 256)
        if path == "compiled":
            patch.setattr(knn_module, "COMPILED_TILE", 256)
        knn(points, 10, points.clone(), exclusion=rule)  # warm up (numba compilation)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as profiler:
            knn(points, 10, points.clone(), exclusion=rule)
    largest = max(event.cpu_memory_usage for event in profiler.events())
    assert 0 < largest < num * num // 8  # a bool mask would be num * num bytes
