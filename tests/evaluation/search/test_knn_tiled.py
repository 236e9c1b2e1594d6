"""Tiled exact search (running top-k, symmetric tiles, rescaling) against brute force."""

from __future__ import annotations

import importlib
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from _peak import PEAK_SOURCE, STEADY_THREADS, needs_proc
from _subprocess import run_python
from pytorch_metric_learning.distances import (
    BaseDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search import _topk
from pytorch_metric_learning.evaluation.search._running_topk import GROUP, RunningTopK
from pytorch_metric_learning.evaluation.search._tiled_search import (
    SeparateSquaredEuclidean,
    SquaredEuclidean,
    search_symmetric,
)

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")

FAST = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    LpDistance(),
    CosineSimilarity(),
    DotProductSimilarity(normalize_embeddings=False),
]


def brute_force_values(query, reference, distance):
    """Every distance from its definition in float64, one query at a time."""
    q, r = query.double().numpy(), reference.double().numpy()
    if distance.normalize_embeddings:
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    rows = []
    for row in q:
        is_lp = isinstance(distance, LpDistance)
        values = np.sqrt(((r - row) ** 2).sum(1)) if is_lp else r @ row
        rows.append(values**distance.power)
    return np.array(rows)


def assert_top_k(values, indices, table, k, largest=False, rtol=0.0):
    """Sorted values equal to argsort's, indices distinct and pointing at those values.

    ``rtol`` also serves as an absolute tolerance near zero; there the square root of a
    rounding error (1e-16 -> 1e-8) is the Euclidean distance's own float64 limit.
    """
    table = np.asarray(table)
    order = np.sort(-table if largest else table, axis=1)[:, :k]
    expected = -order if largest else order
    np.testing.assert_allclose(values, expected, rtol=rtol, atol=rtol and 1e-7)
    np.testing.assert_allclose(
        np.take_along_axis(table, indices, 1), values, rtol=rtol, atol=rtol and 1e-7
    )
    assert all(len(set(row)) == k for row in indices.tolist())


@st.composite
def chunked_matrix(draw):
    rows = draw(st.integers(1, 9))
    # Narrow chunks are compared entry by entry; 64 columns and more go through both
    # levels of group minima (with a ragged rest when not a multiple of 64).
    width = st.one_of(st.integers(1, 3 * GROUP + 5), st.integers(64, 700))
    widths = draw(st.lists(width, min_size=1, max_size=4))
    k = draw(st.integers(1, sum(widths)))
    levels = draw(st.sampled_from([3, 50, 10_000]))  # few levels: many exact ties
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, levels, (rows, sum(widths)), generator=generator).double()
    transposed = draw(st.booleans())
    return matrix, widths, k, transposed


@settings(max_examples=150, deadline=None)
@given(problem=chunked_matrix())
def test_running_topk_equals_topk_with_ties(problem) -> None:
    matrix, widths, k, transposed = problem
    state = RunningTopK(len(matrix), k, matrix.dtype, matrix.device)
    start = 0
    for width in widths:
        chunk = matrix[:, start : start + width]
        if transposed:  # the same values through a transposed (column-major) view
            chunk = chunk.T.contiguous().T
        state.push(0, chunk, start)
        start += width
    values, indices = state.finish()
    assert_top_k(values.numpy(), indices.numpy(), matrix.numpy(), k)


@st.composite
def wide_matrix(draw):
    """Rows wide enough for the two-level threshold, with k small or large against them."""
    rows = draw(st.integers(1, 12))
    width = draw(st.integers(1, 4000))
    k = draw(st.integers(1, max(1, min(width, draw(st.sampled_from([3, 40, 4000]))))))
    levels = draw(st.sampled_from([3, 50, 10_000]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, levels, (rows, width), generator=generator).float()
    return matrix, k, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(problem=wide_matrix())
def test_threshold_topk_equals_sorting_with_ties(problem) -> None:
    matrix, k, largest = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_topk, "_ROWS", 5)  # several row blocks
        values, indices = _topk.topk(matrix, k, largest)
    assert_top_k(values.numpy(), indices.numpy(), matrix.numpy(), k, largest=largest)


def test_grouped_topk_serves_wide_rows(monkeypatch) -> None:
    matrix = torch.randn(3, 5001, generator=torch.Generator().manual_seed(2))
    assert _topk._grouped_pays(5001, 10) and not _topk._grouped_pays(5001, 200)

    def refuse(values, k):
        raise AssertionError("sorted the whole row")

    monkeypatch.setattr(_topk, "_whole", refuse)
    values, indices = _topk.topk(matrix, 10, largest=False)
    assert_top_k(values.numpy(), indices.numpy(), matrix.numpy(), 10)


@pytest.mark.parametrize("width", [4000, 4003, 4007])
def test_grouped_topk_finds_the_leftover_columns_and_one_group_holding_all(width) -> None:
    matrix = torch.rand(4, width, generator=torch.Generator().manual_seed(width)) + 1
    matrix[0, 4000:] = -1.0  # every leftover column (none at 4000)
    matrix[1, 5:4000:500] = -torch.arange(8.0)  # the 8 members of one group are the 8 best
    matrix[2, :] = 7.0  # all tied
    values, indices = _topk.topk(matrix, 12, largest=False)
    assert_top_k(values.numpy(), indices.numpy(), matrix.numpy(), 12)
    assert set(indices[1, :8].tolist()) == set(range(5, 4000, 500))


def test_threshold_topk_with_nan_orders_as_torch_topk() -> None:
    matrix = torch.randn(4, 5000, generator=torch.Generator().manual_seed(3))
    matrix[1, ::7] = torch.nan
    expected = torch.topk(matrix, 10, dim=1, largest=False)
    values, indices = _topk.topk(matrix, 10, largest=False)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_running_topk_rows_fed_in_any_order() -> None:
    matrix = torch.randn(20, 300, generator=torch.Generator().manual_seed(1))
    state = RunningTopK(20, 7, matrix.dtype, matrix.device)
    for first_row in (10, 0):
        for start in (200, 0, 100):
            state.push(first_row, matrix[first_row : first_row + 10, start : start + 100], start)
    values, indices = state.finish()
    assert_top_k(values.numpy(), indices.numpy(), matrix.numpy(), 7)


@st.composite
def integer_points(draw):
    """Small-integer coordinates: float arithmetic is exact, so ties are exact ties."""
    n = draw(st.integers(1, 70))
    extra = draw(st.integers(0, 40))
    dims = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    points = torch.randint(-3, 4, (n + extra, dims), generator=generator).double()
    return points[:n], points, draw(st.integers(1, n + extra))


@settings(max_examples=120, deadline=None)
@given(
    problem=integer_points(),
    tile=st.sampled_from([(1, 1), (3, 5), (8, 8), (5, 3), (32, 200)]),
    skip=st.booleans(),
)
def test_symmetric_tiles_equal_brute_force(problem, tile, skip) -> None:
    query, _, k = problem
    k = min(k, len(query) - skip)
    assume(k >= 1)
    table = ((query[:, None, :] - query[None, :, :]) ** 2).sum(2).numpy()
    if skip:
        np.fill_diagonal(table, np.inf)
    scorer = SquaredEuclidean(query, query, symmetric=True)
    size = (len(query), len(query), k)
    values, indices = search_symmetric(scorer, size, tile, query, skip_diagonal=skip)
    assert_top_k(values.numpy(), indices.numpy(), table, k)


@pytest.fixture()
def small_tiles(monkeypatch):
    """Tiles of 32 x 32 distances, so that small tests cross many tiles; self-search on
    symmetric tiles whatever k."""
    monkeypatch.setattr(knn_module, "TILE_BYTES", 32 * 32 * 8)
    monkeypatch.setattr(knn_module, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0)


@settings(max_examples=60, deadline=None)
@given(
    problem=integer_points(),
    distance_index=st.integers(0, len(FAST) - 1),
    batch_size=st.one_of(st.none(), st.integers(1, 40)),
    mode=st.sampled_from(["none", "is", "separate"]),
    symmetric=st.booleans(),
    drop_self=st.booleans(),
)
def test_custom_knn_fast_paths_equal_brute_force(
    problem, distance_index, batch_size, mode, symmetric, drop_self
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "TILE_BYTES", 32 * 32 * 8)
        patch.setattr(knn_module, "MIN_BLOCK_ROWS", 1)
        patch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0 if symmetric else 10**9)
        query, reference, k = problem
        query = query + 0.5  # no zero rows, so cosine is defined
        reference = query if mode != "separate" else reference + 0.5
        distance = FAST[distance_index]
        drop_self = drop_self and mode != "separate"
        k = min(k, len(reference) - drop_self)
        assume(k >= 1)
        knn = CustomKNN(distance, batch_size=batch_size)
        values, indices = knn(query, k, None if mode == "none" else reference, drop_self)
    table = brute_force_values(query, reference, distance)
    if drop_self:
        np.fill_diagonal(table, -np.inf if distance.is_inverted else np.inf)
    assert_top_k(values.numpy(), indices.numpy(), table, k, distance.is_inverted, rtol=1e-9)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "rows"])
@pytest.mark.parametrize("distance", FAST, ids=repr)
def test_self_search_drops_own_index(small_tiles, monkeypatch, distance, symmetric) -> None:
    if not symmetric:
        monkeypatch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 10**9)
    x = torch.randn(150, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    k = 9
    values, indices = CustomKNN(distance)(x, k, x, ref_includes_query=True)
    table = brute_force_values(x, x, distance)
    np.fill_diagonal(table, -np.inf if distance.is_inverted else np.inf)
    assert not (indices == torch.arange(150).unsqueeze(1)).any()
    assert_top_k(values.numpy(), indices.numpy(), table, k, distance.is_inverted, rtol=1e-9)


def test_symmetric_tiles_serve_self_search_while_few_candidates_beat_the_bounds() -> None:
    pays = knn_module._symmetric_pays
    assert pays(1, 50_000, 4096) and pays(20, 30_000, 4096) and pays(45, 100_000, 4096)
    assert not pays(32, 30_000, 4096) and not pays(100, 50_000, 4096) and not pays(1, 400, 32)


def test_symmetric_equals_one_sided_on_random_float32(small_tiles) -> None:
    x = torch.randn(400, 16, generator=torch.Generator().manual_seed(2))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    self_d, self_i = knn(x, 20)
    other_d, other_i = knn(x, 20, x.clone())  # a copy: the one-sided path
    torch.testing.assert_close(self_d, other_d, rtol=1e-5, atol=1e-4)
    assert (self_i == other_i).float().mean() > 0.99  # only float near-ties may swap


SCALED = [*FAST, SNRDistance()]  # and one distance without a fast path


@pytest.mark.parametrize("scale", [1e20, 1e-25, 2.0**100, 1e-30])
@pytest.mark.parametrize("distance", SCALED, ids=repr)
def test_scaled_embeddings_give_the_same_neighbours(distance, scale) -> None:
    generator = torch.Generator().manual_seed(5)
    query, reference = (
        torch.randn(30, 8, generator=generator),
        torch.randn(60, 8, generator=generator),
    )
    knn = CustomKNN(distance, batch_size=7)
    expected_d, expected_i = knn(query, 5, reference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # squared 1e20 distances overflow
        got_d, got_i = knn(query * scale, 5, reference * scale)
        self_d, self_i = knn(query * scale, 5)
    assert torch.equal(got_i, expected_i)
    assert torch.equal(self_i, knn(query, 5)[1])
    degree = {LpDistance: 1, DotProductSimilarity: 2}.get(type(distance), 0)
    degree = 0 if distance.normalize_embeddings else degree
    expected = expected_d.double() * float(scale) ** (degree * distance.power)
    finite = torch.isfinite(got_d) & (expected.abs() < 3e38) & (expected.abs() > 1e-37)
    torch.testing.assert_close(got_d.double()[finite], expected[finite], rtol=1e-4, atol=0)


def test_overflowing_distances_warn_and_keep_exact_neighbours() -> None:
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.warns(RuntimeWarning, match="exceed the range"):
        distances, indices = knn(x * 1e20, 3)
    assert torch.isinf(distances[:, 1:]).all()
    assert torch.equal(indices, knn(x, 3)[1])


def test_distances_below_float32_warn_and_keep_exact_neighbours() -> None:
    """1e-30 embeddings have squared distances near 1e-60: returned as 0, and 1e-20
    ones near 1e-40, a float32 subnormal that keeps few bits (two can round to one), with
    a warning, and the neighbours of the unscaled embeddings."""
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.warns(RuntimeWarning, match="below the smallest normal torch.float32"):
        distances, indices = knn(x * 1e-30, 3)
    assert bool((distances[:, 1:] == 0).all())
    assert torch.equal(indices, knn(x, 3)[1])
    with pytest.warns(RuntimeWarning, match="rounded to its subnormals"):
        distances, indices = knn(x * 1e-20, 3)  # squared distances near 1e-40: subnormal
    assert bool((distances[:, 1:] < torch.finfo(torch.float32).tiny).all())
    assert torch.equal(indices, knn(x, 3)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        knn(x * 1e-15, 3)  # squared distances near 1e-30: float32 holds them


@pytest.mark.parametrize("exponent", [997, -1000])
@pytest.mark.parametrize("power", [1, 2])
def test_float64_embeddings_near_the_ends_of_float64(exponent, power) -> None:
    """Their squared distances leave float64: returned as inf (with the warning) or 0,
    never an OverflowError, and the neighbours are those of the unscaled embeddings."""
    x = torch.randn(40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=power))
    expected_d, expected_i = knn(x, 4, x.clone(), True)  # a separate search, as below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distances, indices = knn(x * 2.0**exponent, 4, x * 2.0**exponent, True)
    assert torch.equal(indices, expected_i)
    if power == 1:  # 2**997 times distances near 1: still float64
        assert torch.equal(distances, expected_d * 2.0**exponent)
    else:
        assert bool((distances == (torch.inf if exponent > 0 else 0.0)).all())
    overflowed = any("exceed the range" in str(warning.message) for warning in caught)
    assert overflowed == (power == 2 and exponent > 0)
    underflowed = any("below the smallest" in str(warning.message) for warning in caught)
    assert underflowed == (power == 2 and exponent < 0)


def test_float64_subnormal_embeddings_are_scaled_into_range() -> None:
    """2**-1060 needs a factor of 2**1060 to come back near 1: more than one float64."""
    x = torch.randn(40, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.warns(RuntimeWarning, match="below the smallest normal torch.float64"):
        distances, indices = knn(x * 2.0**-1060, 4, x * 2.0**-1060, True)
    assert torch.equal(indices, knn(x, 4, x, True)[1])
    assert bool((distances == 0).all())  # 2**-2120 times distances near 1: below float64


class RecordingLp(LpDistance):
    """Generic-path distance that records the shape of every block it computes."""

    def __init__(self) -> None:
        super().__init__(normalize_embeddings=False, p=1)
        self.shapes: list[tuple[int, int]] = []

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        self.shapes.append((len(query), len(ref)))
        return torch.cdist(query, ref, p=1)


def test_batch_size_keeps_its_block_shape_on_the_generic_path() -> None:
    distance = RecordingLp()
    CustomKNN(distance, batch_size=4)(torch.randn(10, 3), 2, torch.randn(13, 3))
    assert distance.shapes == [(4, 13), (4, 13), (2, 13)]


def _record_tiles(monkeypatch, record) -> None:
    """Call ``record(rows, cols, scores)`` after every tile of both Euclidean scorers."""
    for scorer in (SquaredEuclidean, SeparateSquaredEuclidean):

        def tile(self, rows, cols, out, original=scorer.tile):
            scores = original(self, rows, cols, out)
            record(rows, cols, scores)
            return scores

        monkeypatch.setattr(scorer, "tile", tile)


def test_batch_size_keeps_its_block_shape_on_the_euclidean_path(monkeypatch) -> None:
    shapes = []
    _record_tiles(monkeypatch, lambda rows, cols, scores: shapes.append(tuple(scores.shape)))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=4)
    knn(torch.randn(10, 3), 2, torch.randn(13, 3))
    assert shapes == [(4, 13), (4, 13), (2, 13)]
    shapes.clear()
    knn(torch.randn(10, 3), 2)  # self-search of a few rows: whole rows
    assert shapes == [(4, 10), (4, 10), (2, 10)]
    shapes.clear()
    monkeypatch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0)
    knn(torch.randn(10, 3), 2)  # symmetric: strips on and right of the diagonal
    assert shapes == [(4, 10), (4, 6), (2, 2)]


def test_default_tiles_follow_the_memory_budget(monkeypatch) -> None:
    shapes = []
    _record_tiles(
        monkeypatch,
        lambda rows, cols, _: shapes.append((rows.stop - rows.start, cols.stop - cols.start)),
    )
    monkeypatch.setattr(knn_module, "TILE_BYTES", 64 * 64 * 4)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    knn(torch.randn(100, 3), 2, torch.randn(150, 3))  # whole rows: 27 fit, 109 within 4x
    assert shapes == [(100, 150)]
    shapes.clear()
    monkeypatch.setattr(knn_module, "MIN_BLOCK_ROWS", 20)
    knn(torch.randn(100, 3), 2, torch.randn(150, 3))  # 27 fit the budget: no growth
    assert shapes == [(27, 150)] * 3 + [(19, 150)]
    shapes.clear()
    monkeypatch.setattr(knn_module, "MIN_BLOCK_ROWS", 50)
    knn(torch.randn(120, 3), 2, torch.randn(150, 3))  # grown to 50 rows, within 4x
    assert shapes == [(50, 150)] * 2 + [(20, 150)]
    shapes.clear()
    monkeypatch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0)
    knn(torch.randn(100, 3), 2)  # self-search: 64 x 64 tiles on and above the diagonal
    assert shapes == [(64, 64), (64, 36), (36, 36)]


def test_generic_distance_blocks_keep_the_budget(monkeypatch) -> None:
    shapes = []
    original = SNRDistance.compute_mat

    def compute_mat(self, query, ref):
        shapes.append(tuple(query.shape))
        return original(self, query, ref)

    monkeypatch.setattr(SNRDistance, "compute_mat", compute_mat)
    monkeypatch.setattr(knn_module, "TILE_BYTES", 64 * 64 * 4)
    CustomKNN(SNRDistance())(torch.randn(100, 3), 2, torch.randn(150, 3))
    assert [rows for rows, _ in shapes] == [27, 27, 27, 19]  # no growth past the budget


def test_unknown_distance_subclass_is_not_rescaled() -> None:
    class Custom(BaseDistance):
        def compute_mat(self, query, ref):
            return torch.cdist(query, ref)

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])
    distances, _ = CustomKNN(Custom(normalize_embeddings=False))(x * 1e20, 1, x * 1e20)
    torch.testing.assert_close(distances[:, 0], torch.zeros(3))


_PEAK_SCRIPT = (
    PEAK_SOURCE
    + """
import sys, torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
n, separate = int(sys.argv[1]), sys.argv[2] == "separate"
x = torch.randn(n, 16)
reference = x.clone() if separate else None
knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
knn(x[:64], 10, None if reference is None else reference[:64], True)
before = peak_bytes()
knn(x, 10, reference, True)
print((peak_bytes() - before) // 1024)
"""
)


@pytest.mark.slow
@needs_proc
def test_peak_memory_is_linear_in_n() -> None:
    """Peak RSS growth (torch's allocations included) of a search, in fresh processes."""

    def growth_mib(n, mode):
        env = {**os.environ, **STEADY_THREADS}
        done = run_python(_PEAK_SCRIPT, str(n), mode, env=env, timeout=300)
        return int(done.stdout.split()[-1]) / 1024

    small, large = growth_mib(4_000, "self"), growth_mib(12_000, "self")
    full_matrix_mib = 12_000**2 * 4 / 2**20  # 549 MiB: what a quadratic search would hold
    # A 64 MiB tile and its top-k temporaries, plus outputs that grow with n.
    assert large < 250, f"peak grew by {large:.0f} MiB (a full matrix is {full_matrix_mib:.0f})"
    assert large < 3 * small + 40  # 3x the rows: linear growth, not the 9x of n squared
    assert growth_mib(12_000, "separate") < 250


def test_largest_magnitude_reads_a_repeated_tensor_once(monkeypatch) -> None:
    from pytorch_metric_learning.evaluation.search import _rescale

    reads = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda x: reads.append(x) or real(x))
    x = torch.tensor([[-3.0, 1.0]])
    assert _rescale.largest_magnitude(x, x) == 3.0 and len(reads) == 1  # a self-search
    assert _rescale.largest_magnitude(x, torch.tensor([[5.0]]), torch.empty(0, 1)) == 5.0
    assert _rescale.largest_magnitude(torch.empty(0, 2)) == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("largest", [False, True])
def test_grouped_topk_keeps_the_dtype_of_a_non_contiguous_input(dtype, largest) -> None:
    generator = torch.Generator().manual_seed(4)
    matrix = (torch.randn(37, 4003, generator=generator) * 4).round().to(dtype)
    matrix = matrix.T.contiguous().T  # the same values, column-major
    values, indices = _topk.topk(matrix, 100, largest)
    expected = torch.topk(matrix, 100, dim=1, largest=largest)
    assert values.dtype == dtype and torch.equal(values, expected.values)
    assert torch.equal(matrix.gather(1, indices), values)
    assert all(len(set(row)) == 100 for row in indices.tolist())


_TIED_PEAK_SCRIPT = (
    PEAK_SOURCE
    + """
import sys, torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
x = torch.ones(6000, 16)  # every row tied with every other: all searched again whole
knn = CustomKNN(LpDistance(normalize_embeddings=False), batch_size=600)
k = int(sys.argv[1])
knn(x[:300], 10, None, True)
before = peak_bytes()
knn(x, k, None, True)
print((peak_bytes() - before) // 1024)
"""
)


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("k", [10, 800])
def test_rows_searched_again_keep_to_the_batch_size(k) -> None:
    """With ``batch_size``, peak memory is about one (batch_size, n) block of distances
    plus twice the outputs, also where every row is searched again whole (identical
    rows): the rows searched again at a time hold their candidates and order too (12
    blocks' worth once, 489 MiB at n = 10,000), and the candidates of many neighbours
    are scored and sorted a block's worth at a time (all at once, 7.5 times the outputs
    at k = 1,000)."""
    env = {**os.environ, **STEADY_THREADS}
    done = run_python(_TIED_PEAK_SCRIPT, str(k), env=env, timeout=300)
    growth_mib = int(done.stdout.split()[-1]) / 1024
    block_mib = 600 * 6000 * 4 / 2**20  # 13.7 MiB
    outputs_mib = 6000 * k * 12 / 2**20  # float32 distances, int64 indices
    limit = 3 * block_mib + 2.5 * outputs_mib + 16
    assert growth_mib < limit, f"peak grew by {growth_mib:.0f} MiB"
