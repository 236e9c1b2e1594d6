"""The PyTorch running top-k (``_filtered_topk``) and the walk that uses it before numba is
loaded, against sorting and brute force."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compiled_topk import (
    SEARCH_PROBLEMS,
    _assert_ties_by_index,
    _tiles,
    feed_symmetric,
    feed_tiles,
    search_as_brute_force,
    symmetric_matrix,
    tiled_matrix,
)
from test_knn_tiled import FAST, assert_top_k

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search import _compiled_topk, _filtered_topk
from pytorch_metric_learning.evaluation.search._filtered_topk import FilteredTopK

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")
search_module = importlib.import_module(
    "pytorch_metric_learning.evaluation.search._compiled_search"
)

# Candidates held per row beyond k before a cut: 0 cuts at nearly every tile.
COMPACT = st.sampled_from([0, 3, 64])
# 0: every finish sorts the candidates as one list; 4: in a matrix of rows when it fits.
DENSE = st.sampled_from([0, 4])


def _fed(matrix, widths, k, by_rows):
    return feed_tiles(FilteredTopK(len(matrix), k), matrix, widths, by_rows)


@settings(max_examples=150, deadline=None)
@given(problem=tiled_matrix(), compact=COMPACT, dense=DENSE, by_rows=st.booleans())
def test_rows_fed_tile_by_tile_equal_sorting(problem, compact, dense, by_rows) -> None:
    """Through the rows of each tile, or (``push_columns``) through the columns of the
    transposed tiles; many exact ties."""
    matrix, widths, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_filtered_topk, "COMPACT_PER_ROW", compact)
        patch.setattr(_filtered_topk, "DENSE_SLACK", dense)
        values, indices = _fed(matrix, widths, k, by_rows)
    assert_top_k(values.numpy(), indices.numpy(), matrix.double().numpy(), k)
    _assert_ties_by_index(values, indices)


@settings(max_examples=150, deadline=None)
@given(problem=symmetric_matrix(), compact=COMPACT)
def test_tiles_fed_through_rows_and_columns_at_once_equal_sorting(problem, compact) -> None:
    """The tiles on and above the diagonal of a symmetric matrix: ``push_both`` feeds the
    rows of both its row block and its column block."""
    matrix, side, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_filtered_topk, "COMPACT_PER_ROW", compact)
        state = FilteredTopK(len(matrix), k)
        values, indices = feed_symmetric(state, matrix, side)
    assert_top_k(values.numpy(), indices.numpy(), matrix.double().numpy(), k)
    _assert_ties_by_index(values, indices)


@settings(max_examples=150, deadline=None)
@given(problem=tiled_matrix(), low=st.floats(-1.0, 1e5), compact=COMPACT)
def test_a_preset_bound_keeps_every_value_below_it(problem, low, compact) -> None:
    """With a bound set beforehand, a row is short (fewer than k candidates) exactly when
    fewer than k of its values lie below the bound; the others keep their k smallest."""
    matrix, widths, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_filtered_topk, "COMPACT_PER_ROW", compact)
        state = FilteredTopK(len(matrix), k)
        state.bound[:] = low
        for start, tile in _tiles(matrix, widths):
            state.push_rows(0, tile, start)
    below = (matrix < np.float32(low)).sum(dim=1)
    full = torch.from_numpy(state.count >= k)
    assert torch.equal(full, below >= k)
    values, indices = state.finish()
    table = matrix.double().numpy()
    assert_top_k(values[full].numpy(), indices[full].numpy(), table[full.numpy()], k)
    short = ~full
    assert torch.isinf(values[short]).sum() >= int((k - below[short]).clamp(min=0).sum())


@settings(max_examples=100, deadline=None)
@given(problem=tiled_matrix(), rank=st.integers(1, 200))
def test_kth_smallest_equals_partition(problem, rank) -> None:
    """Small ranks through torch.topk, large ones (over TOPK_MAX_RANK) through kthvalue."""
    matrix, _, _ = problem
    rank = min(rank, matrix.shape[1])
    expected = np.partition(matrix.numpy(), rank - 1, axis=1)[:, rank - 1]
    np.testing.assert_array_equal(FilteredTopK(1, 1).kth_smallest(matrix, rank).numpy(), expected)


def test_finish_renames_candidates_and_places_rows() -> None:
    state = FilteredTopK(num_rows=3, k=2)
    state.push_rows(0, torch.tensor([[5.0, 1.0, 3.0], [2.0, 2.0, 0.0], [9.0, 8.0, 7.0]]), 0)
    numbering = np.array([30, 10, 20], dtype=np.int32)  # candidate i is reference numbering[i]
    values, indices = state.finish(numbering, positions=torch.tensor([2, 0, 1]))
    # row 0 -> output 2, row 1 -> output 0 (ties by renamed index: 10 before 30), row 2 -> 1
    assert values.tolist() == [[0.0, 2.0], [7.0, 8.0], [1.0, 3.0]]
    assert indices.tolist() == [[20, 10], [20, 10], [10, 20]]


def test_a_short_row_ends_with_inf() -> None:
    state = FilteredTopK(num_rows=1, k=3)
    state.bound[:] = 2.0
    state.push_rows(0, torch.tensor([[1.0, 5.0, 0.5, 9.0]]), 0)
    assert state.count.tolist() == [2]
    values, indices = state.finish()
    assert values.tolist() == [[0.5, 1.0, float("inf")]] and indices.tolist() == [[2, 0, 0]]


def test_misuse_is_refused() -> None:
    state = FilteredTopK(10, 2)
    with pytest.raises(ValueError, match="off the diagonal"):
        state.push_both(0, torch.zeros(4, 4), 2)
    with pytest.raises(TypeError, match="float32"):
        state.push_rows(0, torch.zeros(2, 2, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="kth_smallest"):
        state.kth_smallest(torch.zeros(2, 3), 4)
    state.finish()
    with pytest.raises(RuntimeError, match="finish was called twice"):
        state.finish()
    with pytest.raises(RuntimeError, match="no more candidates"):
        state.push_rows(0, torch.zeros(2, 2), 0)


@pytest.fixture()
def filtered_everywhere(monkeypatch):
    """Every float32 CPU search walks tiles of 32 x 32 (a 32-row sample) with the PyTorch
    top-k, as before numba is loaded."""
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    monkeypatch.setattr(knn_module, "_compiled_loads", lambda pairs: False)
    monkeypatch.setattr(knn_module, "COMPILED_TILE", 32)


@settings(max_examples=80, deadline=None)
@given(
    **SEARCH_PROBLEMS,
    threads=st.sampled_from([1, 2, 3]),
    compact=COMPACT,
)
def test_the_pytorch_walk_equals_brute_force(
    problem, distance_index, mode, spread, threads, compact
) -> None:
    """Self and separate search, with ties and duplicate points, on one to three threads;
    spread -100 makes most sampled bounds too low, so those rows are searched again whole.
    "drop self" leaves each row's own index out (ref_includes_query)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "_compiled_loads", lambda pairs: False)
        patch.setattr(_filtered_topk, "COMPACT_PER_ROW", compact)
        made = []
        original = search_module.FilteredTopK
        patch.setattr(search_module, "FilteredTopK", lambda *a: made.append(1) or original(*a))
        search_as_brute_force(patch, problem, FAST[distance_index], mode, (spread, threads))
    k = min(problem[2], len(problem[1 if mode == "separate" else 0]) - (mode == "drop self"))
    assert made or k == 0 or k + 1 > knn_module.FILTERED_MAX_K  # the PyTorch walk served it


def test_the_pytorch_walk_finds_what_the_compiled_one_finds(filtered_everywhere) -> None:
    """Both walks return the first k by (distance, index): the same neighbours."""
    x = torch.randn(700, 16, generator=torch.Generator().manual_seed(3))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    walked = knn(x, 25, None, True)
    if not _compiled_topk.available():
        pytest.skip("the compiled loops are unavailable")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "_compiled_loads", lambda pairs: True)
        compiled = knn(x, 25, None, True)
    torch.testing.assert_close(walked[0], compiled[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(walked[1], compiled[1])


def test_searches_past_its_limit_take_the_other_paths(monkeypatch) -> None:
    """Where numba is not loaded, the PyTorch walk serves searches up to
    FILTERED_MAX_PAIRS pairs; larger ones take the other PyTorch paths."""
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 100)
    monkeypatch.setattr(knn_module, "FILTERED_MAX_PAIRS", 40 * 40)
    monkeypatch.setattr(knn_module, "_compiled_loads", lambda pairs: False)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    x = torch.randn(41, 4)
    assert knn._walk(x[:40], x[:40], 3) is False
    assert knn._walk(x, x, 3) is None
    assert knn._walk(x.double(), x.double(), 3) is None  # float64: never walked
    assert knn._walk(x[:40], x[:40], knn_module.FILTERED_MAX_K + 1) is None  # many neighbours
