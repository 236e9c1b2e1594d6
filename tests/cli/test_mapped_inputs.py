"""Memory-mapped ``.npy`` inputs: the same neighbours and metrics as in-memory ones, and a
peak resident memory that does not grow with the reference file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning import _mapped
from pytorch_metric_learning.cli.loaders import load_embeddings
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.evaluation.search import knn as knn_module

from .conftest import Result


def _oracle(query: np.ndarray, reference: np.ndarray, k: int, skip_self: bool) -> np.ndarray:
    """First k reference rows by (squared distance, index), by a plain loop in float64."""
    found = []
    for i, q in enumerate(query.astype(np.float64)):
        pairs = [
            (float(((q - r) ** 2).sum()), j)
            for j, r in enumerate(reference.astype(np.float64))
            if not (skip_self and i == j)
        ]
        found.append([j for _, j in sorted(pairs)[:k]])
    return np.array(found)


def _mapped_tensor(path: Path, array: np.ndarray) -> torch.Tensor:
    np.save(path, array)
    tensor = load_embeddings(path)
    assert _mapped.is_mapped(tensor)
    return tensor


# sizes of a search of a mapped reference in blocks of block_rows rows
SEARCH_SIZES = {
    "rows": st.integers(1, 40),
    "queries": st.integers(1, 6),
    "k": st.integers(1, 8),
    "block_rows": st.integers(1, 9),
    "includes_query": st.booleans(),
    "seed": st.integers(0, 2**16),
}


@settings(max_examples=25, deadline=None)
@given(**SEARCH_SIZES)
def test_a_mapped_reference_gives_the_exact_first_k_ties_by_index(
    tmp_path_factory: pytest.TempPathFactory,
    rows: int,
    queries: int,
    k: int,
    block_rows: int,
    includes_query: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    # small integers: exact distances with many ties, across block boundaries too
    reference = rng.integers(-2, 3, size=(rows, 3)).astype(np.float32)
    queries = min(queries, rows) if includes_query else queries
    query = reference[:queries].copy() if includes_query else rng.integers(-2, 3, (queries, 3))
    query = query.astype(np.float32)
    k = min(k, rows - 1 if includes_query else rows)
    if k < 1:
        return
    mapped = _mapped_tensor(tmp_path_factory.mktemp("g") / "g.npy", reference)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "MAPPED_BLOCK_BYTES", block_rows * 3 * 4)
        distances, indices = knn(torch.from_numpy(query), k, mapped, includes_query)
    np.testing.assert_array_equal(indices.numpy(), _oracle(query, reference, k, includes_query))
    expected, _ = knn(torch.from_numpy(query), k, torch.from_numpy(reference), includes_query)
    torch.testing.assert_close(distances, expected)


def test_a_mapped_reference_keeps_similarities_largest_first(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((300, 8)).astype(np.float32)
    query = torch.from_numpy(rng.standard_normal((20, 8)).astype(np.float32))
    mapped = _mapped_tensor(tmp_path / "g.npy", reference)
    knn = CustomKNN(CosineSimilarity())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "MAPPED_BLOCK_BYTES", 37 * 8 * 4)
        distances, indices = knn(query, 5, mapped)
    expected = knn(query, 5, torch.from_numpy(reference))
    torch.testing.assert_close(distances, expected[0])
    assert torch.equal(indices, expected[1])


def test_cli_metrics_of_a_mapped_reference_equal_the_api_in_memory(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    reference = rng.integers(-3, 4, size=(500, 4)).astype(np.float32)  # many tied distances
    reference_labels = rng.integers(0, 5, 500)
    query = rng.integers(-3, 4, size=(40, 4)).astype(np.float32)
    labels = rng.integers(0, 5, 40)
    for name, array in [("q", query), ("ql", labels), ("g", reference), ("gl", reference_labels)]:
        np.save(tmp_path / f"{name}.npy", array)
    monkeypatch.setattr(knn_module, "MAPPED_BLOCK_BYTES", 64 * 4 * 4)  # 8 blocks
    names = [tmp_path / f"{name}.npy" for name in ("q", "ql", "g", "gl")]
    result: Result = cli(
        "evaluate", names[0], "--labels", names[1], "--reference", names[2],
        "--reference-labels", names[3], "--output", "-",
    )  # fmt: skip
    assert result.code == 0, result.err
    expected = AccuracyCalculator().get_accuracy(
        torch.from_numpy(query),
        torch.from_numpy(labels),
        torch.from_numpy(reference),
        torch.from_numpy(reference_labels),
    )
    assert json.loads(result.out)["metrics"] == pytest.approx(expected)


def test_a_non_finite_mapped_file_is_refused_by_name(tmp_path: Path) -> None:
    array = np.zeros((50_000, 2), dtype=np.float32)
    array[-1, 1] = np.nan  # in the last block
    np.save(tmp_path / "g.npy", array)
    with pytest.raises(ValueError, match="g.npy.*NaN or infinite"):
        load_embeddings(tmp_path / "g.npy")


DISTANCES = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    CosineSimilarity(),
    DotProductSimilarity(),
]


@settings(max_examples=25, deadline=None)
@given(**SEARCH_SIZES, distance=st.sampled_from(DISTANCES))
def test_a_mapped_float16_reference_is_searched_as_its_float32_values_bit_for_bit(
    tmp_path_factory: pytest.TempPathFactory,
    rows: int,
    queries: int,
    k: int,
    block_rows: int,
    distance: LpDistance | CosineSimilarity | DotProductSimilarity,
    includes_query: bool,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    half = rng.standard_normal((rows, 3)).astype(np.float16)
    queries = min(queries, rows) if includes_query else queries
    query = half[:queries] if includes_query else rng.standard_normal((queries, 3))
    query_32 = torch.from_numpy(query.astype(np.float16).astype(np.float32))
    k = min(k, rows - 1 if includes_query else rows)
    if k < 1:
        return
    folder = tmp_path_factory.mktemp("g")
    np.save(folder / "half.npy", half)
    mapped_half = load_embeddings(folder / "half.npy", keep_float16=True)
    assert mapped_half.dtype == torch.float16 and _mapped.is_mapped(mapped_half)
    mapped_32 = _mapped_tensor(folder / "single.npy", half.astype(np.float32))
    knn = CustomKNN(distance)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(knn_module, "MAPPED_BLOCK_BYTES", block_rows * 3 * 4)
        found = knn(query_32, k, mapped_half, includes_query)
        expected = knn(query_32, k, mapped_32, includes_query)
    assert found[0].dtype == torch.float32
    assert torch.equal(found[0], expected[0]) and torch.equal(found[1], expected[1])
    if distance.power == 2 and not distance.is_inverted and not distance.normalize_embeddings:
        oracle = _oracle(query_32.numpy(), half.astype(np.float32), k, includes_query)
        plain = np.sort(
            [[((q - half[j].astype(np.float64)) ** 2).sum() for j in row] for q, row in
             zip(query_32.numpy().astype(np.float64), oracle)], axis=1
        )  # fmt: skip
        np.testing.assert_allclose(found[0].numpy(), plain, rtol=1e-5, atol=1e-5)


def test_a_float16_file_is_read_as_float32_unless_kept_on_its_mapping(tmp_path: Path) -> None:
    half = np.random.default_rng(1).standard_normal((40_000, 3)).astype(np.float16)
    np.save(tmp_path / "h.npy", half)
    loaded = load_embeddings(tmp_path / "h.npy")
    assert loaded.dtype == torch.float32 and not _mapped.is_mapped(loaded)
    np.testing.assert_array_equal(loaded.numpy(), half.astype(np.float32))
    kept = load_embeddings(tmp_path / "h.npy", keep_float16=True)
    assert kept.dtype == torch.float16 and _mapped.is_mapped(kept)
    np.testing.assert_array_equal(kept.numpy(), half)


def test_a_non_finite_float16_file_is_refused_by_name(tmp_path: Path) -> None:
    array = np.zeros((50_000, 2), dtype=np.float16)
    array[-1, 0] = np.inf  # in the last block
    np.save(tmp_path / "h.npy", array)
    with pytest.raises(ValueError, match="h.npy.*NaN or infinite"):
        load_embeddings(tmp_path / "h.npy", keep_float16=True)


@pytest.mark.parametrize("includes_query", [False, True])
def test_cli_metrics_of_float16_files_equal_those_of_their_float32_values(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, includes_query: bool
) -> None:
    rng = np.random.default_rng(4)
    reference = rng.standard_normal((500, 4)).astype(np.float16)
    query = rng.standard_normal((40, 4)).astype(np.float16)
    reference_labels = rng.integers(0, 5, 500)
    query_labels = reference_labels[:40] if includes_query else rng.integers(0, 5, 40)
    if includes_query:
        reference[:40] = query
    arrays = {
        "q16": query, "q32": query.astype(np.float32), "g16": reference,
        "g32": reference.astype(np.float32), "ql": query_labels, "gl": reference_labels,
    }  # fmt: skip
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
    monkeypatch.setattr(knn_module, "MAPPED_BLOCK_BYTES", 64 * 4 * 4)  # 8 blocks
    outputs = []
    for bits in ("16", "32"):
        result: Result = cli(
            "evaluate", tmp_path / f"q{bits}.npy", "--labels", tmp_path / "ql.npy",
            "--reference", tmp_path / f"g{bits}.npy", "--reference-labels",
            tmp_path / "gl.npy", "--output", "-", *(["--ref-includes-query"] * includes_query),
        )  # fmt: skip
        assert result.code == 0, result.err
        outputs.append(json.loads(result.out)["metrics"])
    assert outputs[0] == outputs[1]
