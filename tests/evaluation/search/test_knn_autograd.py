"""Inputs that require grad are searched as their values: no autograd graph, on every path
and thread count (grad mode is per thread, and the walks run tiles on pool threads)."""

from __future__ import annotations

import pytest
import torch
from test_knn_ties import PATHS, _force

from pytorch_metric_learning.distances import (
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
)
from pytorch_metric_learning.evaluation import AccuracyCalculator, CustomKNN
from pytorch_metric_learning.evaluation.search import _compiled_topk

DISTANCES = [
    LpDistance(normalize_embeddings=False, power=2),
    LpDistance(normalize_embeddings=False),
    DotProductSimilarity(normalize_embeddings=False),
    CosineSimilarity(),
]


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("distance", DISTANCES, ids=lambda d: repr(d).split("(")[0])
@pytest.mark.parametrize("tracked", ["query", "reference", "both", "self"])
def test_inputs_that_require_grad_are_searched_as_their_values(
    path, distance, tracked, threads
) -> None:
    if path == "compiled" and not _compiled_topk.installed():
        pytest.skip("numba is not installed")
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(150, 6, generator=generator)
    reference = None if tracked == "self" else torch.randn(170, 6, generator=generator)
    tracked_query = query.clone().requires_grad_(tracked in ("query", "both", "self"))
    tracked_reference = None
    if reference is not None:
        tracked_reference = reference.clone().requires_grad_(tracked in ("reference", "both"))
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, path, 64 * 2**20)
        expected = CustomKNN(distance)(query, 5, reference)
        found = CustomKNN(distance)(tracked_query, 5, tracked_reference)
    assert not found[0].requires_grad and found[0].grad_fn is None
    assert torch.equal(found[1], expected[1])
    assert torch.equal(found[0], expected[0])


def test_the_calculator_takes_embeddings_that_require_grad(threads) -> None:
    generator = torch.Generator().manual_seed(4)
    query, reference = (
        torch.randn(60, 4, generator=generator),
        torch.randn(80, 4, generator=generator),
    )
    labels = torch.arange(140) % 5
    calculator = AccuracyCalculator(include=("precision_at_1", "r_precision"))
    with pytest.MonkeyPatch.context() as patch:
        _force(patch, "compiled" if _compiled_topk.installed() else "rows", 64 * 2**20)
        expected = calculator.get_accuracy(query, labels[:60], reference, labels[60:])
        found = calculator.get_accuracy(
            query.requires_grad_(), labels[:60], reference.requires_grad_(), labels[60:]
        )
    assert found == expected
