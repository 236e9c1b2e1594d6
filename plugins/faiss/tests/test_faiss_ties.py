"""FaissKNN returns exactly the first k references by (distance, index), ties included."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pytorch_metric_learning_faiss import FaissKNN

pytestmark = pytest.mark.faiss


def oracle(query: np.ndarray, reference: np.ndarray, inner: bool, k: int, drop_self: bool):
    """A stable sort of all references by distance (squared L2, or inner product, largest first)."""
    rows = []
    for i, q in enumerate(query):
        key = -(reference @ q) if inner else ((reference - q) ** 2).sum(1)
        candidates = [j for j in range(len(reference)) if not (drop_self and j == i)]
        rows.append(sorted(candidates, key=lambda j: key[j])[:k])
    return np.array(rows)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 50),
    dims=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    inner=st.booleans(),
    drop_self=st.booleans(),
    k=st.integers(1, 60),
)
def test_ties_are_broken_by_index(n, dims, seed, inner, drop_self, k) -> None:
    generator = torch.Generator().manual_seed(seed)
    points = torch.randint(-1, 2, (n, dims), generator=generator).float()  # many exact ties
    k = min(k, n - drop_self)
    assume(k >= 1)
    index_init_fn = faiss.IndexFlatIP if inner else faiss.IndexFlatL2
    knn = FaissKNN(index_init_fn=index_init_fn)
    _, indices = knn(points, k, points, drop_self)
    expected = oracle(points.double().numpy(), points.double().numpy(), inner, k, drop_self)
    np.testing.assert_array_equal(indices.numpy(), expected)
