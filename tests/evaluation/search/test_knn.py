"""CustomKNN against a brute-force argsort written here."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.distances import (
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search.knn import remove_self_matches

DISTANCES = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    LpDistance(),
    LpDistance(normalize_embeddings=False, p=1),
    CosineSimilarity(),
    DotProductSimilarity(normalize_embeddings=False),
    SNRDistance(),
]


def brute_force(query, k, reference, distance, ref_includes_query=False):
    """Per-query loop: every value computed from the definition, then a stable argsort."""
    q, r = query.double().numpy(), reference.double().numpy()
    if distance.normalize_embeddings:
        q = q / np.linalg.norm(q, ord=distance.p, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, ord=distance.p, axis=1, keepdims=True)
    all_d, all_i = [], []
    for i, row in enumerate(q):
        if isinstance(distance, LpDistance):
            values = (np.abs(r - row) ** distance.p).sum(1) ** (1 / distance.p)
        elif isinstance(distance, SNRDistance):
            values = np.array([np.var(row - x, ddof=1) / np.var(row, ddof=1) for x in r])
        else:
            values = r @ row
        values = values**distance.power
        order = np.argsort(-values if distance.is_inverted else values, kind="stable")
        if ref_includes_query:
            order = order[order != i][:k] if i in order[: k + 1] else order[:k]
        all_i.append(order[:k])
        all_d.append(values[order[:k]])
    return np.array(all_d), np.array(all_i)


@st.composite
def search_problem(draw):
    n_query = draw(st.integers(1, 12))
    n_extra = draw(st.integers(0, 12))
    dims = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    query = torch.from_numpy(rng.normal(size=(n_query, dims)))
    reference = torch.from_numpy(rng.normal(size=(n_query + n_extra, dims)))
    return query, reference


@given(
    problem=search_problem(),
    distance_index=st.integers(0, len(DISTANCES) - 1),
    k_fraction=st.floats(0, 1),
    batch_size=st.one_of(st.none(), st.integers(1, 5)),
)
def test_equals_brute_force(problem, distance_index, k_fraction, batch_size) -> None:
    query, reference = problem
    distance = DISTANCES[distance_index]
    k = max(1, int(k_fraction * len(reference)))
    distances, indices = CustomKNN(distance, batch_size=batch_size)(query, k, reference)
    expected_d, expected_i = brute_force(query, k, reference, distance)
    np.testing.assert_array_equal(indices.numpy(), expected_i)
    np.testing.assert_allclose(distances.numpy(), expected_d, rtol=1e-9, atol=1e-9)


@given(
    problem=search_problem(),
    distance_index=st.integers(0, len(DISTANCES) - 1),
    batch_size=st.one_of(st.none(), st.integers(1, 5)),
)
def test_ref_includes_query_equals_brute_force(problem, distance_index, batch_size) -> None:
    query, extra = problem
    reference = torch.cat([query, extra])
    distance = DISTANCES[distance_index]
    k = max(1, len(reference) // 2)
    knn = CustomKNN(distance, batch_size=batch_size)
    distances, indices = knn(query, k, reference, ref_includes_query=True)
    expected_d, expected_i = brute_force(query, k, reference, distance, ref_includes_query=True)
    np.testing.assert_array_equal(indices.numpy(), expected_i)
    np.testing.assert_allclose(distances.numpy(), expected_d, rtol=1e-9, atol=1e-9)


@given(problem=search_problem(), batch_size=st.integers(1, 5))
def test_batched_equals_unbatched(problem, batch_size) -> None:
    query, reference = problem
    for distance in DISTANCES:
        k = len(reference)
        full = CustomKNN(distance)(query, k, reference)
        batched = CustomKNN(distance, batch_size=batch_size)(query, k, reference)
        torch.testing.assert_close(batched, full, rtol=1e-12, atol=1e-12)


def test_self_removal_when_self_is_absent() -> None:
    # Row 0's own index (0) is present; row 1's own index (1) is not: its last neighbour goes.
    distances = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.75]])
    indices = torch.tensor([[0, 7, 8], [5, 6, 9]])
    kept_d, kept_i = remove_self_matches(distances, indices)
    assert kept_i.tolist() == [[7, 8], [5, 6]]
    assert kept_d.tolist() == [[0.5, 0.25], [0.0, 0.0]]


@given(
    rows=st.lists(
        st.tuples(st.permutations(list(range(12))), st.integers(2, 12), st.booleans()),
        min_size=1,
        max_size=8,
    ),
)
def test_self_removal_equals_a_plain_loop(rows) -> None:
    width = min(w for _, w, _ in rows)
    indices, expected = [], []
    for number, (order, _, keep_own) in enumerate(rows):
        # Row ``number``'s own index appears at most once, wherever the permutation puts it.
        row = [i if i != number or keep_own else 100 + i for i in order[:width]]
        indices.append(row)
        expected.append([i for i in row if i != number] if number in row else row[:-1])
    indices_t = torch.tensor(indices)
    distances = indices_t.double() / 10
    kept_d, kept_i = remove_self_matches(distances, indices_t)
    assert kept_i.tolist() == expected
    assert kept_d.tolist() == (torch.tensor(expected).double() / 10).tolist()


def test_duplicate_rows_drop_own_index_not_the_twin() -> None:
    reference = torch.tensor([[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]])
    _, indices = CustomKNN(LpDistance(normalize_embeddings=False))(
        reference[:2], 1, reference, ref_includes_query=True
    )
    assert indices.tolist() == [[1], [0]]


def test_reference_none_searches_the_query() -> None:
    x = torch.randn(6, 3)
    knn = CustomKNN(LpDistance(normalize_embeddings=False))
    torch.testing.assert_close(knn(x, 3), knn(x, 3, x))


@pytest.mark.parametrize("normalize", [False, True])
def test_half_precision_dtypes(normalize) -> None:
    query = torch.randn(5, 4).half()
    knn = CustomKNN(LpDistance(normalize_embeddings=normalize, power=2), batch_size=2)
    distances, indices = knn(query, 2, torch.randn(7, 4).half())
    assert distances.dtype == (torch.float16 if normalize else torch.float32)
    assert indices.dtype == torch.long


def test_bfloat16_similarity() -> None:
    query = torch.randn(5, 4).bfloat16()
    distances, indices = CustomKNN(CosineSimilarity())(query, 2, query)
    assert distances.dtype == torch.bfloat16
    assert indices[:, 0].tolist() == list(range(5))


def test_no_autograd_graph_and_nothing_retained() -> None:
    query = torch.randn(4, 3, requires_grad=True)
    reference = torch.randn(9, 3, requires_grad=True)
    knn = CustomKNN(CosineSimilarity(), batch_size=2)
    distances, indices = knn(query, 3, reference)
    assert not distances.requires_grad and distances.grad_fn is None
    watched = weakref.ref(distances)
    del distances, indices
    gc.collect()
    assert watched() is None
    assert all(not isinstance(v, torch.Tensor) for v in vars(knn).values())


def test_nothing_retained_after_a_failed_search() -> None:
    knn = CustomKNN(LpDistance())
    with pytest.raises(ValueError):
        knn(torch.randn(3, 2), 5, torch.randn(4, 2))
    assert set(vars(knn)) == {"distance", "batch_size"}


def test_empty_query() -> None:
    distances, indices = CustomKNN(LpDistance())(torch.empty(0, 3), 2, torch.randn(4, 3))
    assert distances.shape == indices.shape == (0, 2)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda knn: knn(torch.randn(3, 2), 0, torch.randn(4, 2)), ValueError, "'k'"),
        (lambda knn: knn(torch.randn(3, 2), 2.0, torch.randn(4, 2)), TypeError, "'k'"),
        (lambda knn: knn(torch.randn(3, 2), 5, torch.randn(4, 2)), ValueError, "at most 4"),
        (
            lambda knn: knn(torch.randn(3, 2), 4, torch.randn(4, 2), ref_includes_query=True),
            ValueError,
            "at most 3",
        ),
        (lambda knn: knn(torch.randn(3), 1, torch.randn(4, 2)), ValueError, "2-D"),
        (lambda knn: knn(torch.randn(3, 2), 1, torch.randn(4, 3)), ValueError, "columns"),
        (
            lambda knn: knn(torch.tensor([[float("nan"), 0.0]]), 1, torch.randn(4, 2)),
            ValueError,
            "NaN",
        ),
        (
            lambda knn: knn(torch.randn(3, 2), 1, torch.tensor([[float("inf"), 0.0]])),
            ValueError,
            "infinite",
        ),
        (
            lambda knn: knn(torch.randn(3, 2), 1, torch.randn(4, 2, device="meta")),
            ValueError,
            "device",
        ),
        (lambda knn: knn([[1.0, 2.0]], 1), TypeError, "query"),
    ],
)
def test_bad_input(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(CustomKNN(LpDistance()))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("not a distance",), TypeError),
        ((LpDistance(), 0), ValueError),
        ((LpDistance(), 1.5), TypeError),
    ],
)
def test_bad_construction(args, error) -> None:
    with pytest.raises(error):
        CustomKNN(*args)


@pytest.mark.faiss
def test_agrees_with_faiss_index_flat_l2() -> None:
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(3)
    reference = rng.normal(size=(500, 16)).astype("float32")
    query = rng.normal(size=(40, 16)).astype("float32")
    index = faiss.IndexFlatL2(16)
    index.add(reference)
    expected_d, expected_i = index.search(query, 10)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=16)
    distances, indices = knn(torch.from_numpy(query), 10, torch.from_numpy(reference))
    np.testing.assert_array_equal(indices.numpy(), expected_i)
    np.testing.assert_allclose(distances.numpy(), expected_d, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("largest", [False, True])
@pytest.mark.parametrize(("width", "k"), [(2000, 1), (2000, 5), (2001, 7), (5003, 20), (300, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_equals_torch_topk(width, k, largest, ties) -> None:
    from pytorch_metric_learning.evaluation.search._topk import topk

    generator = torch.Generator().manual_seed(width + k)
    values = torch.randn(9, width, generator=generator, dtype=torch.float64)
    if ties:
        values = values.mul(3).round()
    got_values, got_indices = topk(values, k, largest=largest)
    expected = torch.topk(values, k, dim=1, largest=largest, sorted=True)
    torch.testing.assert_close(got_values, expected.values, rtol=0, atol=0)
    torch.testing.assert_close(torch.gather(values, 1, got_indices), got_values, rtol=0, atol=0)
    assert all(len(set(row)) == k for row in got_indices.tolist())
