"""Euclidean searches of embeddings far from the origin run on rows moved near it."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_knn_ties import PATHS, _force

from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search import _centring, _compiled_topk, _pair_scores

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")


def far_cluster(n: int, dims: int, offset: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, dims, generator=generator) + offset


def test_only_unnormalized_distances_far_from_the_origin_are_moved() -> None:
    far, near = far_cluster(200, 8, 1000.0), far_cluster(200, 8, 0.0)
    uniform = torch.rand(200, 8, generator=torch.Generator().manual_seed(1))
    euclidean = LpDistance(normalize_embeddings=False)
    centre = _centring.centre_of(euclidean, far)
    assert centre is not None and centre.dtype == torch.float64
    torch.testing.assert_close(centre, far.double().mean(dim=0))
    assert _centring.centre_of(euclidean, near) is None
    assert _centring.centre_of(euclidean, uniform) is None  # ratio 3: not worth a copy
    assert _centring.centre_of(LpDistance(), far) is None  # normalized: not translatable
    assert _centring.centre_of(CosineSimilarity(), far) is None
    assert _centring.centre_of(DotProductSimilarity(normalize_embeddings=False), far) is None


def test_the_mean_comes_from_a_spaced_sample_of_a_large_reference(monkeypatch) -> None:
    monkeypatch.setattr(_centring, "SAMPLE_ROWS", 10)
    points = far_cluster(100, 4, 50.0)
    centre = _centring.centre_of(LpDistance(normalize_embeddings=False), points)
    torch.testing.assert_close(centre, points[::10].double().mean(dim=0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_moved_rows_take_the_type_of_the_search(dtype) -> None:
    rows = far_cluster(5, 3, 10.0).to(dtype)
    centre = rows.double().mean(dim=0)
    moved = _centring.centred(rows, centre, rows)
    assert moved.dtype == (torch.float32 if dtype == torch.float16 else dtype)
    wide = _centring.centred(rows.float(), centre, rows.double())
    assert wide.dtype == torch.float64


def refined_rows(patch: pytest.MonkeyPatch) -> list[int]:
    """Records how many rows each whole-row search of ``refine`` takes."""
    counts: list[int] = []
    original = _pair_scores._first_k

    def counting(pairs, block, *args):
        counts.append(len(block))
        return original(pairs, block, *args)

    patch.setattr(_pair_scores, "_first_k", counting)
    return counts


@pytest.mark.parametrize("separate", [False, True])
def test_few_rows_far_from_the_origin_are_searched_again_whole(separate) -> None:
    """Unmoved, the rounding of 1e6-sized squared norms exceeds the gaps between
    neighbours, and nearly every row was searched again whole."""
    points = far_cluster(600, 16, 1000.0)
    query = points[:200] + 0.1 if separate else points
    reference = points if separate else None
    searched = {}
    for ratio in (_centring.CENTRE_RATIO, float("inf")):  # moved, never moved
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_centring, "CENTRE_RATIO", ratio)
            counts = refined_rows(patch)
            CustomKNN(LpDistance(normalize_embeddings=False))(query, 10, reference, not separate)
        searched[ratio] = sum(counts)
    assert searched[_centring.CENTRE_RATIO] <= 0.02 * len(query)
    assert searched[float("inf")] >= 0.5 * len(query)  # what the move saves


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.sampled_from([1, 3, 16, 40]),
    offset=st.sampled_from([0.0, 30.0, 1000.0, -1e4]),
    spread=st.sampled_from([1e-3, 1.0]),
    copies=st.booleans(),
    path=st.sampled_from(PATHS),
    batch_size=st.one_of(st.none(), st.integers(1, 17)),
    mode=st.sampled_from(["self", "self drop", "separate"]),
    power=st.sampled_from([1.0, 2.0, 0.5]),
    wide=st.booleans(),
    k=st.integers(1, 40),
)
def test_moving_the_rows_never_changes_a_result(
    seed, dims, offset, spread, copies, path, batch_size, mode, power, wide, k
) -> None:
    """The search runs on moved rows, the distances are scored from the rows as given:
    moved or not, the neighbours and distances are the same to the bit."""
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    if path in ("compiled", "walk"):
        batch_size = None
    generator = torch.Generator().manual_seed(seed)
    points = torch.randn(70, dims, generator=generator) * spread + offset
    if copies:
        points = torch.cat([points, points[torch.randint(0, 70, (50,), generator=generator)]])
    if wide:
        points = points.double()
    drop = mode == "self drop"
    query = points[::3] + spread if mode == "separate" else points
    k = min(k, len(points) - drop)
    assume(k >= 1)
    found = []
    for ratio in (-1.0, float("inf")):  # always moved, never moved
        with pytest.MonkeyPatch.context() as patch:
            _force(patch, path, 32 * 32 * 4)
            patch.setattr(_centring, "CENTRE_RATIO", ratio)
            knn = CustomKNN(LpDistance(normalize_embeddings=False, power=power), batch_size)
            found.append(knn(query, k, points if mode == "separate" else None, drop))
    (moved_values, moved_indices), (values, indices) = found
    assert torch.equal(moved_indices, indices)
    assert torch.equal(moved_values, values)
