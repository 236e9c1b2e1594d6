"""Every search path returns exactly the first k references by (distance, index).

The oracle is a stable sort of all references by their distance, computed from the
definition in float64 (exact on small-integer embeddings, which have many exact ties).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance
from pytorch_metric_learning.evaluation import AccuracyCalculator, CustomKNN
from pytorch_metric_learning.evaluation.search import _compiled_topk
from pytorch_metric_learning.evaluation.search._ties import first_k_of_rows, order_ties

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")

# Distances computed exactly from small integers on every path (no normalization).
EXACT = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    DotProductSimilarity(normalize_embeddings=False),
]
# "walk": the PyTorch tile walk that serves searches before numba is loaded.
PATHS = ["rows", "symmetric", "compiled", "walk"]


def oracle(query: np.ndarray, reference: np.ndarray, distance, k: int, drop_self: bool):
    """First k reference indices of each query row: a stable sort by distance of all."""
    rows = []
    for i, q in enumerate(query):
        if isinstance(distance, LpDistance):
            values = np.sqrt(((reference - q) ** 2).sum(1)) ** distance.power
        else:
            values = reference @ q
        key = -values if distance.is_inverted else values
        candidates = [j for j in range(len(reference)) if not (drop_self and j == i)]
        rows.append(sorted(candidates, key=lambda j: key[j])[:k])  # sorted() is stable
    return np.array(rows)


@st.composite
def tied_points(draw):
    """Integer coordinates from few levels, with duplicated rows: many exact ties."""
    n = draw(st.integers(2, 60))
    dims = draw(st.integers(1, 4))
    levels = draw(st.sampled_from([1, 2, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    points = torch.randint(-levels, levels + 1, (n, dims), generator=generator).float()
    repeats = torch.randint(0, n, (draw(st.integers(0, n)),), generator=generator)
    points = torch.cat([points, points[repeats]])
    order = torch.randperm(len(points), generator=generator)
    return points[order]


def _force(patch: pytest.MonkeyPatch, path: str, tile_bytes: int) -> None:
    patch.setattr(knn_module, "TILE_BYTES", tile_bytes)
    patch.setattr(knn_module, "MIN_BLOCK_ROWS", 1)
    symmetric = path == "symmetric"
    patch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0 if symmetric else 10**9)
    if path in ("compiled", "walk"):
        patch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
        patch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
        patch.setattr(knn_module, "COMPILED_TILE", 32)
        patch.setattr(_compiled_topk, "MIN_PART", 1)
        if path == "walk":
            patch.setattr(knn_module, "_compiled_loads", lambda pairs: False)
    else:
        patch.setattr(knn_module, "COMPILED_MIN_PAIRS", 2**62)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    points=tied_points(),
    split=st.floats(0.2, 1.0),
    distance_index=st.integers(0, len(EXACT) - 1),
    path=st.sampled_from(PATHS),
    batch_size=st.one_of(st.none(), st.integers(1, 17)),
    tile_bytes=st.sampled_from([8 * 8 * 4, 32 * 32 * 8, 64 * 2**20]),
    mode=st.sampled_from(["self", "self drop", "separate"]),
    k=st.integers(1, 200),
)
def test_every_path_returns_the_first_k_by_distance_then_index(
    points, split, distance_index, path, batch_size, tile_bytes, mode, k
) -> None:
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    if path in ("compiled", "walk"):
        batch_size = None  # the walks serve searches without a batch_size
    num_query = max(1, int(len(points) * split))
    query = points[:num_query] if mode == "separate" else points
    reference = points if mode == "separate" else None
    drop = mode == "self drop"
    k = min(k, len(points) - drop)
    assume(k >= 1)
    distance = EXACT[distance_index]
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, tile_bytes)
        values, indices = CustomKNN(distance, batch_size=batch_size)(query, k, reference, drop)
    expected = oracle(query.double().numpy(), points.double().numpy(), distance, k, drop)
    np.testing.assert_array_equal(indices.numpy(), expected)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    points=tied_points(),
    path=st.sampled_from(PATHS),
    ks=st.lists(st.integers(1, 80), min_size=2, max_size=4),
)
def test_fewer_neighbours_are_a_prefix_of_more(points, path, ks) -> None:
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    ks = sorted({min(k, len(points) - 1) for k in ks})
    assume(ks[0] >= 1)
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, 8 * 8 * 4)
        found = [CustomKNN(EXACT[0])(points, k, None, True)[1] for k in ks]
    for short, long in zip(found, found[1:]):
        assert torch.equal(short, long[:, : short.shape[1]])


@settings(max_examples=25, deadline=None)
@given(points=tied_points(), seed=st.integers(0, 2**31 - 1))
def test_adding_metrics_never_changes_another(points, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (len(points),), generator=generator)
    alone = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(points, labels)
    more = AccuracyCalculator(
        include=("precision_at_1", "recall_at_8", "r_precision", "mean_average_precision")
    ).get_accuracy(points, labels)
    np.testing.assert_equal(alone["precision_at_1"], more["precision_at_1"])  # NaN == NaN


def test_the_issue_case_duplicates_at_the_first_place() -> None:
    """Two copies of each point: the nearest is the copy, at distance 0, whatever k."""
    base = torch.tensor([[0.0], [10.0], [20.0]])
    points = torch.cat([base, base, torch.tensor([[0.0]])])  # three rows at 0.0
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    alone = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(points, labels)
    more = AccuracyCalculator(include=("precision_at_1", "recall_at_4")).get_accuracy(
        points, labels
    )
    assert alone["precision_at_1"] == more["precision_at_1"]


def test_first_k_of_rows_keeps_the_lowest_tied_columns() -> None:
    values = torch.tensor([[3.0, 1.0, 3.0, 0.0, 3.0]])
    assert first_k_of_rows(values, 3, largest=False)[1].tolist() == [[3, 1, 0]]
    assert first_k_of_rows(values, 2, largest=True)[1].tolist() == [[0, 2]]


def test_order_ties_only_touches_tied_rows() -> None:
    distances = torch.tensor([[1.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    indices = torch.tensor([[5, 2, 0], [9, 1, 4]])
    _, ordered = order_ties(distances, indices, largest=False)
    assert ordered.tolist() == [[2, 5, 0], [9, 1, 4]]


class RecordingEuclidean(LpDistance):
    """The fast squared Euclidean distance, recording the blocks of references it prepares
    after the search's own (only the recomputation of rows tied at the k-th place
    prepares more)."""

    def __init__(self) -> None:
        super().__init__(normalize_embeddings=False, power=2)
        self.blocks: list[tuple[int, int]] = []
        self.searched = False

    def prepare(self, query, ref=None):
        if self.searched and ref is not None:
            self.blocks.append((len(query), len(ref)))
        self.searched = True
        return super().prepare(query, ref)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("separate", [True, False])
def test_rows_tied_at_the_kth_place_are_recomputed_a_block_of_references_at_a_time(
    path, separate
) -> None:
    """The recomputation never holds a distance temporary of the whole reference (a
    million-row gallery's squared copy was 512 MB): its blocks stay within the tile budget,
    and the result is still the first k by (distance, index)."""
    if path == "compiled" and not _compiled_topk.installed():
        pytest.skip("numba is not installed")
    points = torch.arange(40.0).repeat_interleave(3).unsqueeze(1)  # every value three times
    query = points[::7] + 0.5 if separate else points  # each query equally near two values
    distance = RecordingEuclidean()
    tile_bytes = 8 * 4  # blocks of 8 one-dimensional float32 references
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, tile_bytes)
        _, indices = CustomKNN(distance)(query, 4, points if separate else None)
    assert distance.blocks, "no row was tied at the k-th place"
    assert max(ref_rows for _, ref_rows in distance.blocks) <= 8
    assert sum(ref_rows for _, ref_rows in distance.blocks) % len(points) == 0  # whole rows
    expected = oracle(query.double().numpy(), points.double().numpy(), EXACT[0], 4, False)
    np.testing.assert_array_equal(indices.numpy(), expected)


@st.composite
def float_points_with_copies(draw):
    """Float coordinates (rounded anew by every product) with rows copied several times,
    shuffled, and a query of copies of some of them."""
    n = draw(st.integers(2, 90))
    dims = draw(st.sampled_from([1, 3, 16, 70]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    offset = draw(st.sampled_from([0.0, 1000.0]))  # far from the origin: norms cancel
    base = torch.randn(n, dims, generator=generator) * scale + offset
    copies = torch.randint(0, n, (draw(st.integers(n // 2, 3 * n)),), generator=generator)
    points = torch.cat([base, base[copies]])
    points = points[torch.randperm(len(points), generator=generator)]
    query = points[torch.randint(0, len(points), (max(1, n // 2),), generator=generator)]
    return points, query


def copy_classes(points: torch.Tensor) -> torch.Tensor:
    """Each row's class of identical rows (the first row of the class)."""
    first = {}
    return torch.tensor([first.setdefault(tuple(row.tolist()), i) for i, row in enumerate(points)])


def assert_copies_agree(values, indices, classes, own=None) -> None:
    """A row's neighbours are sorted, equal values by index; the copies of a neighbour lie
    at the same value, and those of lower index are neighbours too (before it). ``own``:
    each row's own index, which a search that drops it never returns."""
    _assert_sorted_ties_by_index(values, indices)
    for row, (found, at) in enumerate(zip(indices.tolist(), values.tolist())):
        value_of = dict(zip(found, at))
        for index in found:
            copies = (classes == classes[index]).nonzero().flatten().tolist()
            lower = [c for c in copies if c < index and (own is None or c != own[row])]
            assert all(c in value_of for c in lower), (row, index, lower, found)
            assert all(value_of[c] == value_of[index] for c in copies if c in value_of)


def _assert_sorted_ties_by_index(values, indices) -> None:
    steps = values[:, 1:] - values[:, :-1]
    assert bool((steps >= 0).all() or (steps <= 0).all())
    tied = values[:, 1:] == values[:, :-1]
    assert bool((indices[:, 1:][tied] > indices[:, :-1][tied]).all())


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    problem=float_points_with_copies(),
    distance_index=st.integers(0, 5),
    path=st.sampled_from(PATHS),
    batch_size=st.one_of(st.none(), st.integers(1, 17)),
    mode=st.sampled_from(["self", "self drop", "separate"]),
    ks=st.lists(st.integers(1, 70), min_size=2, max_size=3),
    threads=st.sampled_from([1, 2]),
    wide=st.booleans(),
)
def test_copies_of_a_row_lie_at_one_distance_whatever_the_path_and_k(
    problem, distance_index, path, batch_size, mode, ks, threads, wide
) -> None:
    """Rounding must not tell identical rows apart: on every path, at any k, a query's
    distances to copies of one reference are equal, so copies come in index order and the
    neighbours at k are the first k of those at a larger k (a symmetric walk once scored
    the two sides of its diagonal with different roundings: a copy of higher index then
    displaced a lower one, only at some k)."""
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    if path in ("compiled", "walk"):
        batch_size = None
    points, query = problem
    if wide:  # float64, whose powers once rounded by their place in the tensor
        points, query = points.double(), query.double()
    query = query if mode == "separate" else points
    drop = mode == "self drop"
    ks = sorted({min(k, len(points) - drop) for k in ks})
    assume(ks[0] >= 1)
    distance = [*EXACT, LpDistance(), CosineSimilarity(), LpDistance(power=1.5)][distance_index]
    classes = copy_classes(points)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with pytest.MonkeyPatch.context() as patch:
            _force(patch, path, 32 * 32 * 4)
            knn = CustomKNN(distance, batch_size=batch_size)
            reference = points if mode == "separate" else None
            found = [knn(query, k, reference, drop) for k in ks]
    finally:
        torch.set_num_threads(before)
    own = list(range(len(points))) if drop else None
    for values, indices in found:
        assert_copies_agree(values, indices, classes, own)
    for (_, short), (_, long) in zip(found, found[1:]):
        assert torch.equal(short, long[:, : short.shape[1]])
    if mode != "self drop":  # identical queries have identical neighbours
        query_classes = copy_classes(query)
        values, indices = found[-1]
        assert torch.equal(indices, indices[query_classes])
        assert torch.equal(values, values[query_classes])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    offset=st.sampled_from([100.0, 1000.0, 1e4]),
    path=st.sampled_from(PATHS),
    separate=st.booleans(),
)
def test_a_cluster_far_from_the_origin_gets_its_true_neighbours(
    seed, offset, path, separate
) -> None:
    """Squared norms of 1e6 to 1e8 cancel in a product's score, whose rounding then
    exceeds the gaps between neighbours (every path once returned wrong ones): the
    neighbours and distances equal float64 brute force's."""
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    generator = torch.Generator().manual_seed(seed)
    points = torch.randn(150, 8, generator=generator) + offset
    query = points[:40] + torch.randn(40, 8, generator=generator) if separate else points
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, 32 * 32 * 4)
        values, indices = CustomKNN(LpDistance(normalize_embeddings=False))(
            query, 5, points if separate else None, not separate
        )
    table = torch.cdist(query.double(), points.double()).numpy()
    if not separate:
        np.fill_diagonal(table, np.inf)
    expected = np.sort(table, axis=1)[:, :5]
    np.testing.assert_allclose(values.double().numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(table, indices.numpy(), 1), expected, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.sampled_from([2, 4, 16]),
    count=st.integers(2, 60),
    spread=st.sampled_from([1e-7, 1e-6]),
    power=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    path=st.sampled_from(PATHS),
    ks=st.lists(st.integers(1, 60), min_size=2, max_size=3),
)
def test_references_at_nearly_one_distance_keep_one_order_at_every_k(
    seed, dims, count, spread, power, path, ks
) -> None:
    """References on a sphere around each query, radii 1 +- ``spread``: distinct scores
    that round to a handful of reported values (a square root halves their differences),
    or powers whose last bit once followed a value's place in the tensor. At every k the
    neighbours are the first k of a larger k's, distances included, ties by index."""
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(3, dims, generator=generator)
    ks = sorted({min(k, count) for k in ks})
    directions = torch.nn.functional.normalize(
        torch.randn(3, count, dims, generator=generator), dim=2
    )
    radii = 1 + spread * torch.randn(3, count, 1, generator=generator)
    reference = (query.unsqueeze(1) + directions * radii).reshape(-1, dims)
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, 32 * 32 * 4)
        knn = CustomKNN(LpDistance(normalize_embeddings=False, power=power))
        found = [knn(query, k, reference) for k in ks]
    for values, indices in found:
        _assert_sorted_ties_by_index(values, indices)
    for (short_values, short), (long_values, long) in zip(found, found[1:]):
        assert torch.equal(short, long[:, : short.shape[1]])
        assert torch.equal(short_values, long_values[:, : short.shape[1]])


@pytest.mark.parametrize("power", [0.7, 1.5, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_power_is_the_same_for_copies_in_any_block(power, dtype) -> None:
    """Raised to a power other than 1 or 2, copies of a reference keep one distance
    whether the query rows come one at a time or all at once (a float64 power's last bit
    once followed its place in the tensor)."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(50, 8, generator=generator, dtype=torch.float64)
    points = base[torch.randint(0, 50, (300,), generator=generator)].to(dtype)
    distance = LpDistance(normalize_embeddings=False, power=power)
    whole = CustomKNN(distance)(points, 10, points, True)
    single = CustomKNN(distance, batch_size=1)(points, 10, points, True)
    assert torch.equal(whole[1], single[1])
    assert torch.equal(whole[0], single[0])
    assert_copies_agree(*whole, copy_classes(points), list(range(len(points))))
