"""MatchFinder against plain loops over pairs."""

from __future__ import annotations

import doctest
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.distances import (
    BaseDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
)
from pytorch_metric_learning.evaluation import MatchFinder
from pytorch_metric_learning.evaluation.verification import match_finder


def test_seed_sample() -> None:
    import torch

    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.evaluation import MatchFinder

    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    reference = torch.tensor([[1.0, 0.1], [1.0, 1.0], [-1.0, 0.0]])
    finder = MatchFinder(CosineSimilarity(), threshold=0.9)
    matches = finder.get_match_matrix(query, reference)
    assert matches.tolist() == [[True, False, False], [False, False, False]]
    assert finder.get_match_indices(query, reference).tolist() == [[0, 0]]
    assert finder.is_match(query, reference[:2]).tolist() == [True, False]


def test_2x_import_path() -> None:
    from pytorch_metric_learning.utils.inference import MatchFinder as Legacy

    assert Legacy is MatchFinder


# ---- oracles: values of single pairs, computed in Python ---------------------------------


def squared_euclidean(a: list[float], b: list[float]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b))


def euclidean(a: list[float], b: list[float]) -> float:
    return math.sqrt(squared_euclidean(a, b))


def cosine(a: list[float], b: list[float]) -> float:
    norm_a = math.sqrt(sum(x * x for x in a))
    norm_b = math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (norm_a * norm_b)


def oracle_matrix(value_fn, query, ref, threshold, is_inverted) -> list[list[bool]]:
    rows = []
    for q in query.tolist():
        values = [value_fn(q, r) for r in ref.tolist()]
        rows.append([v >= threshold if is_inverted else v <= threshold for v in values])
    return rows


def oracle_indices(matrix: list[list[bool]]) -> list[list[int]]:
    return [[i, j] for i, row in enumerate(matrix) for j, match in enumerate(row) if match]


integer_embeddings = st.integers(0, 6).flatmap(
    lambda rows: st.lists(
        st.lists(st.integers(-3, 3), min_size=3, max_size=3), min_size=rows, max_size=rows
    )
)


def squared_manhattan(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b)) ** 2


EXACT_DISTANCES = [
    # integer embeddings and thresholds make these exact, so boundaries are tested exactly
    (LpDistance(normalize_embeddings=False), euclidean),
    (LpDistance(normalize_embeddings=False, p=1, power=2), squared_manhattan),
]


@given(
    integer_embeddings,
    integer_embeddings,
    st.integers(0, 40),
    st.booleans(),
    st.sampled_from(EXACT_DISTANCES),
)
def test_distances_match_oracle_at_exact_boundaries(query, ref, threshold, self_compare, case):
    distance, value_fn = case
    query_t = torch.tensor(query, dtype=torch.float32).reshape(-1, 3)
    ref_t = query_t if self_compare else torch.tensor(ref, dtype=torch.float32).reshape(-1, 3)
    finder = MatchFinder(distance, threshold=threshold)
    expected = oracle_matrix(value_fn, query_t, ref_t, threshold, is_inverted=False)
    ref_arg = None if self_compare else ref_t
    assert finder.get_match_matrix(query_t, ref_arg).tolist() == expected
    assert finder.get_match_indices(query_t, ref_arg).tolist() == oracle_indices(expected)
    pairs = min(len(query_t), len(ref_t))
    matched = finder.is_match(query_t[:pairs], ref_t[:pairs])
    assert matched.tolist() == [expected[i][i] for i in range(pairs)]


def _separated_threshold(values: list[float]) -> float | None:
    """A threshold at least 1e-3 away from every value (None if there is none)."""
    points = sorted(set(values)) + [math.inf]
    gaps = [(b - a, (a + b) / 2) for a, b in zip(points, points[1:]) if b - a > 2e-3]
    return gaps[len(gaps) // 2][1] if gaps and math.isfinite(gaps[len(gaps) // 2][1]) else None


@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 2**16),
    st.sampled_from(["cosine", "euclidean"]),
)
def test_matrix_and_indices_match_oracle(num_query, num_ref, seed, kind) -> None:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(num_query, 4, generator=generator)
    ref = torch.randn(num_ref, 4, generator=generator)
    if kind == "cosine":
        distance, value_fn, is_inverted = CosineSimilarity(), cosine, True
    else:
        distance = LpDistance(normalize_embeddings=False)
        value_fn, is_inverted = euclidean, False
    values = [value_fn(q, r) for q in query.tolist() for r in ref.tolist()]
    threshold = _separated_threshold(values + [min(values) - 1.0])
    if threshold is None:
        return
    finder = MatchFinder(distance, threshold=threshold)
    expected = oracle_matrix(value_fn, query, ref, threshold, is_inverted)
    assert finder.get_match_matrix(query, ref).tolist() == expected
    assert finder.get_match_indices(query, ref).tolist() == oracle_indices(expected)
    pairs = min(num_query, num_ref)
    assert finder.is_match(query[:pairs], ref[:pairs]).tolist() == [
        expected[i][i] for i in range(pairs)
    ]


def test_similarity_matches_at_least_the_threshold_and_distance_at_most() -> None:
    query = torch.tensor([[1.0, 0.0]])
    ref = torch.tensor([[2.0, 0.0], [4.0, 0.0], [0.0, 3.0]])
    dot = MatchFinder(DotProductSimilarity(normalize_embeddings=False), threshold=2.0)
    assert dot.get_match_matrix(query, ref).tolist() == [[True, True, False]]
    lp = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
    assert lp.get_match_matrix(query, ref).tolist() == [[True, False, False]]


def test_normalization_and_power_are_honoured() -> None:
    query = torch.tensor([[3.0, 0.0]])
    ref = torch.tensor([[0.0, 4.0]])
    # raw Euclidean distance 5, squared 25; normalized rows are sqrt(2) apart (squared 2)
    cases = [
        (LpDistance(normalize_embeddings=False), 5.0, 4.9),
        (LpDistance(normalize_embeddings=False, power=2), 25.0, 24.9),
        (LpDistance(), math.sqrt(2) + 1e-6, math.sqrt(2) - 1e-3),
        (LpDistance(power=2), 2.0 + 1e-6, 1.99),
    ]
    for distance, matching, too_strict in cases:
        finder = MatchFinder(distance)
        for method in (finder.get_match_matrix, finder.is_match):
            assert method(query, ref, threshold=matching).tolist() in ([[True]], [True])
            assert method(query, ref, threshold=too_strict).tolist() in ([[False]], [False])
    cosine = MatchFinder(CosineSimilarity())
    assert cosine.is_match(torch.tensor([[5.0, 0.0]]), torch.tensor([[1.0, 1.0]]), 0.7).item()
    assert not cosine.is_match(torch.tensor([[5.0, 0.0]]), torch.tensor([[1.0, 1.0]]), 0.71)


def test_method_threshold_overrides_constructor() -> None:
    query = torch.tensor([[0.0], [1.0], [3.0]])
    finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=0.5)
    assert finder.get_match_matrix(query).sum().item() == 3
    assert finder.get_match_matrix(query, threshold=1.0).sum().item() == 5
    assert len(finder.get_match_indices(query, threshold=1.0)) == 5
    assert finder.is_match(query, query + 1, threshold=1.0).tolist() == [True] * 3
    assert finder.is_match(query, query + 1).tolist() == [False] * 3
    assert finder.threshold == 0.5


@pytest.mark.parametrize("method", ["get_match_matrix", "get_match_indices", "is_match"])
def test_no_threshold_anywhere_raises_value_error(method) -> None:
    finder = MatchFinder(CosineSimilarity())
    embeddings = torch.randn(3, 2)
    with pytest.raises(ValueError, match="threshold"):
        getattr(finder, method)(embeddings, embeddings)


def test_ref_none_compares_query_with_itself() -> None:
    query = torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.3]])
    finder = MatchFinder(CosineSimilarity(), threshold=0.95)
    itself = finder.get_match_matrix(query)
    assert itself.tolist() == finder.get_match_matrix(query, query).tolist()
    assert itself.diagonal().all()
    assert (
        finder.get_match_indices(query).tolist() == finder.get_match_indices(query, query).tolist()
    )
    # a distance with a negative threshold: no row matches itself
    strict = MatchFinder(LpDistance(), threshold=-1.0)
    assert not strict.get_match_matrix(query).diagonal().any()


class _PairwiseOnly(LpDistance):
    """Fails if a full matrix is requested, and records whether autograd was on."""

    def __init__(self) -> None:
        super().__init__(normalize_embeddings=False)
        self.grad_enabled: list[bool] = []

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        raise AssertionError("is_match must not build a matrix")

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.grad_enabled.append(torch.is_grad_enabled())
        assert x.shape == y.shape
        return super().compute_pairwise(x, y)


def test_is_match_uses_pairwise_only() -> None:
    distance = _PairwiseOnly()
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    y = torch.tensor([[0.5, 0.0], [5.0, 5.0]])
    result = MatchFinder(distance, 1.0).is_match(x, y)
    assert result.tolist() == [True, False]
    assert result.dtype == torch.bool and result.shape == (2,)
    assert distance.grad_enabled == [False]


class _RecordingDistance(LpDistance):
    def __init__(self) -> None:
        super().__init__(normalize_embeddings=False, p=1, power=2)
        self.blocks: list[tuple[int, int]] = []
        self.grad_enabled: list[bool] = []

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        self.blocks.append((len(query), len(ref)))
        self.grad_enabled.append(torch.is_grad_enabled())
        return super().compute_mat(query, ref)


def test_matrix_is_built_in_bounded_row_blocks(monkeypatch) -> None:
    monkeypatch.setattr(match_finder, "_BLOCK_ELEMENTS", 20)
    generator = torch.Generator().manual_seed(3)
    query = torch.randint(-3, 4, (23, 3), generator=generator).float()
    ref = torch.randint(-3, 4, (6, 3), generator=generator).float()
    distance = _RecordingDistance()
    finder = MatchFinder(distance, threshold=6.0)
    expected = oracle_matrix(squared_manhattan, query, ref, 6.0, is_inverted=False)
    assert finder.get_match_matrix(query, ref).tolist() == expected
    assert distance.blocks == [(3, 6)] * 7 + [(2, 6)]
    distance.blocks.clear()
    assert finder.get_match_indices(query, ref).tolist() == oracle_indices(expected)
    assert max(rows * cols for rows, cols in distance.blocks) <= 20
    assert sum(rows for rows, _ in distance.blocks) == len(query)
    assert not any(distance.grad_enabled)


def test_indices_are_row_major_across_blocks(monkeypatch) -> None:
    monkeypatch.setattr(match_finder, "_BLOCK_ELEMENTS", 1)
    query = torch.tensor([[0.0], [1.0], [2.0]])
    finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
    assert finder.get_match_indices(query).tolist() == [
        [0, 0], [0, 1], [1, 0], [1, 1], [1, 2], [2, 1], [2, 2]
    ]  # fmt: skip


def test_outputs_carry_no_graph_and_have_documented_types() -> None:
    query = torch.randn(4, 3, requires_grad=True)
    ref = torch.randn(5, 3, requires_grad=True)
    finder = MatchFinder(CosineSimilarity(), threshold=0.0)
    matrix = finder.get_match_matrix(query, ref)
    indices = finder.get_match_indices(query, ref)
    matched = finder.is_match(query, ref[:4])
    assert matrix.dtype == torch.bool and matrix.shape == (4, 5)
    assert indices.dtype == torch.long and indices.shape == (int(matrix.sum()), 2)
    assert matched.dtype == torch.bool and matched.shape == (4,)
    for output in (matrix, indices, matched):
        assert not output.requires_grad and output.grad_fn is None
        assert output.device == query.device


def test_empty_inputs() -> None:
    finder = MatchFinder(LpDistance(), threshold=1.0)
    query = torch.zeros(0, 3)
    ref = torch.randn(4, 3)
    assert finder.get_match_matrix(query, ref).shape == (0, 4)
    assert finder.get_match_indices(query, ref).shape == (0, 2)
    assert finder.get_match_matrix(ref, torch.zeros(0, 3)).shape == (4, 0)
    assert finder.get_match_indices(ref, torch.zeros(0, 3)).shape == (0, 2)
    assert finder.is_match(query, query).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_other_dtypes(dtype) -> None:
    query = torch.tensor([[0.0, 0.0], [2.0, 0.0]], dtype=dtype)
    finder = MatchFinder(LpDistance(normalize_embeddings=False, power=2), threshold=4.0)
    assert finder.get_match_matrix(query).tolist() == [[True, True], [True, True]]
    assert finder.get_match_matrix(query, threshold=3.9).tolist() == [[True, False], [False, True]]


def test_get_matching_pairs_is_a_deprecated_2x_alias() -> None:
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    reference = torch.tensor([[1.0, 0.1], [1.0, 1.0], [-1.0, 0.0]])
    finder = MatchFinder(CosineSimilarity(), threshold=0.9)
    with pytest.warns(DeprecationWarning, match="get_match_matrix") as record:
        matrix = finder.get_matching_pairs(query, reference)
    assert record[0].filename == __file__
    assert isinstance(matrix, np.ndarray) and matrix.dtype == np.bool_
    expected = (CosineSimilarity()(query, reference) >= 0.9).numpy()
    assert np.array_equal(matrix, expected)
    with pytest.warns(DeprecationWarning):
        tuples = finder.get_matching_pairs(query, reference, threshold=0.7, return_tuples=True)
    dense = (CosineSimilarity()(query, reference) >= 0.7).numpy()
    assert tuples == list(zip(*np.where(dense)))
    assert all(isinstance(i, np.integer) for pair in tuples for i in pair)
    with pytest.warns(DeprecationWarning):
        itself = finder.get_matching_pairs(reference, threshold=-2.0)
    assert itself.shape == (3, 3) and itself.all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finder.get_match_matrix(query, reference)  # the new names do not warn


def test_invalid_arguments() -> None:
    with pytest.raises(TypeError, match="distance"):
        MatchFinder("cosine")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="threshold"):
        MatchFinder(CosineSimilarity(), threshold="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold"):
        MatchFinder(CosineSimilarity(), threshold=math.nan)
    finder = MatchFinder(CosineSimilarity(), threshold=0.5)
    with pytest.raises(ValueError, match="threshold"):
        finder.get_match_matrix(torch.randn(2, 3), threshold=math.nan)
    with pytest.raises(ValueError):
        finder.is_match(torch.randn(2, 3), torch.randn(3, 3))
    with pytest.raises(ValueError):
        finder.get_match_matrix(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="finite"):
        finder.get_match_matrix(torch.tensor([[math.nan, 0.0]]))
    with pytest.raises(ValueError):
        finder.get_match_indices(torch.randn(3))
    with pytest.raises(TypeError):
        finder.is_match(torch.tensor([[1, 0]]), torch.tensor([[1, 0]]))


def test_numpy_and_infinite_thresholds_are_accepted() -> None:
    query = torch.tensor([[0.0], [1.0]])
    finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=np.float32(0.5))
    assert finder.threshold == 0.5 and type(finder.threshold) is float
    assert finder.get_match_matrix(query, threshold=math.inf).all()
    assert not finder.get_match_matrix(query, threshold=-math.inf).any()


def test_threshold_is_compared_in_the_values_dtype() -> None:
    """0.9 rounds to the float32 similarity 0.9f, which is at least the threshold."""
    finder = MatchFinder(DotProductSimilarity(normalize_embeddings=False), threshold=0.9)
    x = torch.tensor([[0.9]])
    assert finder.is_match(x, torch.ones(1, 1)).item()
    assert finder.get_match_matrix(x, torch.ones(1, 1)).item()


def test_docstring_examples() -> None:
    assert doctest.testmod(match_finder, raise_on_error=True).attempted > 0


def test_base_distance_subclasses_are_accepted() -> None:
    assert isinstance(MatchFinder(LpDistance()).distance, BaseDistance)
