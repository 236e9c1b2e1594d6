"""The k-NN contract as users meet it: check_knn_output, and AccuracyCalculator's checks of
what a backend returns (each failure names the backend), against plain brute-force loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning import errors
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    CustomKNN,
    check_knn_backend,
    check_knn_output,
    knn_is_inverted,
    register_knn_backend,
    remove_self_matches,
)
from pytorch_metric_learning.evaluation.distributed import DistributedKNN


def points(n: int = 30, dims: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=generator)
    return torch.randn(n, dims, generator=generator, dtype=torch.float64), labels


def brute_force(query: torch.Tensor, k: int, reference: torch.Tensor, skip_self: bool):
    """Nearest-first squared Euclidean neighbours, one query at a time."""
    rows = []
    for i, q in enumerate(query.tolist()):
        found = [
            (sum((a - b) ** 2 for a, b in zip(q, r)), j)
            for j, r in enumerate(reference.tolist())
            if not (skip_self and j == i)
        ]
        rows.append(sorted(found)[:k])
    distances = torch.tensor([[d for d, _ in row] for row in rows], dtype=query.dtype)
    return distances, torch.tensor([[j for _, j in row] for row in rows], dtype=torch.long)


class ForgetfulKNN:
    """Exact search that ignores ref_includes_query: every query finds itself first."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        reference = query if reference is None else reference
        return brute_force(query, k, reference, skip_self=False)


class FarthestFirstKNN:
    """Right neighbours, reversed: the farthest of the k comes first."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        distances, indices = brute_force(query, k, reference, ref_includes_query)
        return distances.flip(1), indices.flip(1)


class Similarities:
    """Dot-product similarities, largest first; declares it with is_inverted."""

    def __init__(self, is_inverted: bool = True, flip: bool = False) -> None:
        self.is_inverted = is_inverted
        self.flip = flip

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        scores = query @ reference.T
        if ref_includes_query:
            scores.fill_diagonal_(-torch.inf)
        values, indices = torch.topk(scores, k, dim=1)
        return (values.flip(1), indices.flip(1)) if self.flip else (values, indices)


def calc(knn_func) -> AccuracyCalculator:
    return AccuracyCalculator(include=("precision_at_1", "r_precision"), knn_func=knn_func)


# ----- AccuracyCalculator names the backend in every failure -----


def test_a_backend_that_keeps_self_matches_is_caught_not_scored_1() -> None:
    x, y = points()
    with pytest.raises(errors.BackendOutputError, match="ForgetfulKNN") as info:
        calc(ForgetfulKNN()).get_accuracy(x, y)
    assert isinstance(info.value, ValueError)
    assert "own index" in str(info.value) and "remove_self_matches" in str(info.value)


def test_the_registry_name_is_in_the_message() -> None:
    register_knn_backend("forgetful", ForgetfulKNN)
    x, y = points()
    with pytest.raises(ValueError, match=r"'forgetful' \(ForgetfulKNN\)"):
        calc("forgetful").get_accuracy(x, y)


def test_rows_not_nearest_first_are_caught() -> None:
    x, y = points()
    with pytest.raises(ValueError, match="FarthestFirstKNN.*not sorted nearest first"):
        calc(FarthestFirstKNN()).get_accuracy(x[:10], y[:10], x, y)


def test_similarities_are_accepted_when_declared_and_checked_in_their_order() -> None:
    x, y = points()
    result = calc(Similarities()).get_accuracy(x[:10], y[:10], x[10:], y[10:])
    expected = calc(CustomKNN(_dot())).get_accuracy(x[:10], y[:10], x[10:], y[10:])
    assert result == expected
    with pytest.raises(ValueError, match="similarities descending"):
        calc(Similarities(flip=True)).get_accuracy(x[:10], y[:10], x[10:], y[10:])
    with pytest.raises(ValueError, match="distances ascending.*is_inverted"):
        calc(Similarities(is_inverted=False)).get_accuracy(x[:10], y[:10], x[10:], y[10:])


def _dot():
    from pytorch_metric_learning.distances import DotProductSimilarity

    return DotProductSimilarity(normalize_embeddings=False)


def test_minus_one_indices_are_explained_as_padding() -> None:
    def padded(query, k, reference=None, ref_includes_query=False):
        distances, indices = brute_force(query, k, reference, ref_includes_query)
        indices[0, -1], distances[0, -1] = -1, torch.inf
        return distances, indices

    x, y = points()
    with pytest.raises(ValueError, match="padded.*-1 indices.*faiss-style padding"):
        calc(padded).get_accuracy(x[:5], y[:5], x, y)


def test_numpy_results_get_a_conversion_hint() -> None:
    def numpy_knn(query, k, reference=None, ref_includes_query=False):
        distances, indices = brute_force(query, k, reference, ref_includes_query)
        return distances.numpy(), indices.numpy()

    x, y = points()
    with pytest.raises(TypeError, match="numpy_knn.*numpy.ndarray.*torch.from_numpy"):
        calc(numpy_knn).get_accuracy(x, y)


def test_width_k_plus_one_hints_at_ref_includes_query() -> None:
    def no_removal(query, k, reference=None, ref_includes_query=False):
        return brute_force(query, k + int(ref_includes_query), reference, False)

    x, y = points()
    with pytest.raises(ValueError, match=r"no_removal.*width is k \+ 1.*ref_includes_query"):
        calc(no_removal).get_accuracy(x, y)


def test_width_k_plus_one_without_a_self_search_says_so() -> None:
    def one_too_many(query, k, reference=None, ref_includes_query=False):
        return brute_force(query, k + 1, reference, False)

    x, y = points()
    with pytest.raises(ValueError, match=r"width is k \+ 1.*had ref_includes_query=False"):
        calc(one_too_many).get_accuracy(x[:5], y[:5], x[5:], y[5:])


@pytest.mark.parametrize(
    "broken, match, error",
    [
        (lambda d, i: (d, i.int()), "torch.long", TypeError),
        (lambda d, i: (d, i.to(torch.uint64)), "Got torch.uint64.*indices.long", TypeError),
        (lambda d, i: (d.long(), i), "floating-point distances", TypeError),
        (lambda d, i: (d, i.to("meta")), "query's device", ValueError),
        (lambda d, i: (d * torch.nan, i), "NaN distances", ValueError),
        (lambda d, i: (d, i + 1000), "outside the reference", ValueError),
        (lambda d, i: d, "tuple", TypeError),
    ],
)
def test_each_break_of_the_contract(broken, match, error) -> None:
    def knn(query, k, reference=None, ref_includes_query=False):
        return broken(*brute_force(query, k, reference, ref_includes_query))

    x, y = points()
    with pytest.raises(error, match=match) as info:
        calc(knn).get_accuracy(x, y)
    assert isinstance(info.value, errors.PMLError) and "knn_func" in str(info.value)


# ----- check_knn_output for plugin authors -----


@given(
    n=st.integers(2, 25),
    k_fraction=st.floats(0.0, 1.0),
    self_search=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_brute_force_answers_pass_and_any_shuffled_row_fails(n, k_fraction, self_search, seed):
    query, _ = points(n, seed=seed)
    reference = query if self_search else points(n + 3, seed=seed + 1)[0]
    most = len(reference) - int(self_search)
    k = max(1, round(k_fraction * most))
    output = brute_force(query, k, reference, self_search)
    checked = check_knn_output(output, query, k, reference, self_search)
    assert checked[0] is output[0] and checked[1] is output[1]
    distances, indices = output
    if k >= 2 and distances[0, 0] < distances[0, -1]:
        swapped = distances.clone(), indices.clone()
        swapped[0][0, [0, -1]] = distances[0, [-1, 0]]
        with pytest.raises(errors.BackendOutputError, match="row 0"):
            check_knn_output(swapped, query, k, reference, self_search)


def test_k_may_be_n_minus_one_in_a_self_search() -> None:
    x, y = points(12)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    distances, indices = check_knn_output(knn(x, 11, x, True), x, 11, x, True, backend=knn)
    expected = brute_force(x, 11, x, skip_self=True)
    assert torch.equal(indices, expected[1])
    torch.testing.assert_close(distances, expected[0])


def test_ties_and_rounding_are_not_disorder() -> None:
    query = torch.zeros(1, 2)
    one = torch.tensor(1.0)
    below = torch.nextafter(one, torch.tensor(0.0))
    output = (torch.stack([one, below, below, one]).view(1, 4), torch.arange(4).view(1, 4))
    assert check_knn_output(output, query, 4, torch.zeros(4, 2))[1] is output[1]


def test_the_calculator_passes_one_tensor_object_for_a_self_search() -> None:
    seen = []

    def spy(query, k, reference=None, ref_includes_query=False):
        seen.append((reference is query, ref_includes_query))
        return CustomKNN(LpDistance(normalize_embeddings=False))(query, k, reference, True)

    x, y = points()
    calc(spy).get_accuracy(x, y)
    calc(spy).get_accuracy(x.numpy(), y)
    assert seen == [(True, True), (True, True)]


@given(seed=st.integers(0, 2**16), n=st.integers(2, 12), width=st.integers(2, 6))
def test_remove_self_matches_against_a_loop(seed, n, width) -> None:
    generator = torch.Generator().manual_seed(seed)
    width = min(width, n)
    # Distinct indices in each row, as a search returns them.
    indices = torch.stack([torch.randperm(n, generator=generator)[:width] for _ in range(n)])
    distances = torch.rand(n, width, generator=generator)
    kept_d, kept_i = remove_self_matches(distances, indices)
    for row in range(n):
        own = [c for c in range(width) if int(indices[row, c]) == row]
        keep = [c for c in range(width) if c not in (own or [width - 1])]
        assert kept_i[row].tolist() == indices[row, keep].tolist()
        assert kept_d[row].tolist() == distances[row, keep].tolist()


def test_one_rule_says_whether_a_backend_returns_similarities() -> None:
    class Declared(ForgetfulKNN):
        is_inverted = True
        distance = LpDistance()

    class NotABool:
        is_inverted = "yes"

    assert knn_is_inverted(CustomKNN(CosineSimilarity())) is True
    assert knn_is_inverted(CustomKNN(LpDistance())) is False
    assert knn_is_inverted(Declared()) is True  # the backend's own declaration wins
    assert knn_is_inverted(NotABool()) is False
    assert DistributedKNN(Declared()).is_inverted is True
    assert DistributedKNN(CustomKNN(CosineSimilarity())).is_inverted is True


def test_numpy_inputs_to_check_knn_output_are_rejected_with_their_types() -> None:
    query = torch.zeros(2, 2)
    output = (np.zeros((2, 1)), np.zeros((2, 1), dtype=np.int64))
    with pytest.raises(errors.BackendOutputTypeError, match="'hnsw'.*numpy.ndarray"):
        check_knn_output(output, query, 1, backend="hnsw")


# ----- check_knn_backend: a tiny search through every check -----


class RotatingKNN:
    """Valid answers (all tied, never the query itself) that change from call to call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls += 1
        rows = torch.arange(len(query)).unsqueeze(1)
        columns = torch.arange(k).unsqueeze(0)
        if ref_includes_query:
            indices = (rows + 1 + columns) % len(reference)
        else:
            indices = (columns + self.calls + 0 * rows) % len(reference)
        return torch.ones(len(query), k), indices


@pytest.mark.parametrize(
    "knn", [CustomKNN(LpDistance(normalize_embeddings=False)), CustomKNN(CosineSimilarity())]
)
def test_check_knn_backend_passes_exact_search(knn) -> None:
    check_knn_backend(knn)


def test_check_knn_backend_catches_a_forgetful_backend() -> None:
    with pytest.raises(errors.BackendOutputError, match="ForgetfulKNN.*own index"):
        check_knn_backend(ForgetfulKNN())


def test_check_knn_backend_catches_nondeterminism() -> None:
    with pytest.raises(errors.BackendOutputError, match="'rotating'.*deterministic"):
        check_knn_backend(RotatingKNN(), backend="rotating")


# ----- a neighbour listed twice, and noise in the distances -----


class RepeatingKNN:
    """Lists each query's nearest neighbour k times: every metric would count it k times."""

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        distances, indices = brute_force(query, 1, reference, ref_includes_query)
        return distances.expand(-1, k).clone(), indices.expand(-1, k).clone()


def test_a_neighbour_listed_twice_in_a_row_is_caught_not_scored() -> None:
    x, y = points()
    register_knn_backend("repeating", RepeatingKNN)
    with pytest.raises(
        errors.BackendOutputError,
        match=r"'repeating' \(RepeatingKNN\).*is registered in-process\.$",
    ) as info:
        calc("repeating").get_accuracy(x, y)
    assert "more than once" in str(info.value) and "row 0" in str(info.value)
    with pytest.raises(ValueError, match="RepeatingKNN.*more than once"):
        check_knn_backend(RepeatingKNN())


class NoisyDistancesKNN:
    """The right neighbours, with distances that change from call to call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls += 1
        distances, indices = brute_force(query, k, reference, ref_includes_query)
        return distances + 1e-3 * self.calls, indices


def test_check_knn_backend_catches_distances_that_change_between_runs() -> None:
    with pytest.raises(errors.BackendOutputError, match="'noisy'.*different distances"):
        check_knn_backend(NoisyDistancesKNN(), backend="noisy")
