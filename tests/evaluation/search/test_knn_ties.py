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

from pytorch_metric_learning.distances import DotProductSimilarity, LpDistance
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
PATHS = ["rows", "symmetric", "compiled"]


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
    if path == "compiled":
        patch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
        patch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
        patch.setattr(knn_module, "COMPILED_TILE", 32)
        patch.setattr(_compiled_topk, "MIN_PART", 1)
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
    if path == "compiled":
        batch_size = None  # the compiled path serves searches without a batch_size
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
    """The fast squared Euclidean distance, recording the blocks ``powered_mat`` computes
    (only the recomputation of rows tied at the k-th place calls it on this path)."""

    def __init__(self) -> None:
        super().__init__(normalize_embeddings=False, power=2)
        self.blocks: list[tuple[int, int]] = []

    def powered_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        self.blocks.append((len(query), len(ref)))
        return super().powered_mat(query, ref)


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
