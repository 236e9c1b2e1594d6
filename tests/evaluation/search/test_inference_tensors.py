"""Inference tensors (made under ``torch.inference_mode()``, as Lightning's validation loop
makes them) have no version counter: every public entry point that searches must take them,
inside inference mode and out, and give what it gives for ordinary tensors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import BackendOutputError
from pytorch_metric_learning.evaluation import AccuracyCalculator, CustomKNN
from pytorch_metric_learning.evaluation.distributed import AccuracyAccumulator
from pytorch_metric_learning.evaluation.search._checked_search import search_knn

EXACT = CustomKNN(LpDistance(normalize_embeddings=False))


def plain_knn(query, k, reference=None, ref_includes_query=False):
    """A backend the library does not know (so its answer is spot-checked)."""
    return EXACT(query, k, reference, ref_includes_query)


def one_shot(e: torch.Tensor, y: torch.Tensor) -> Any:
    return AccuracyCalculator(k="max_bin_count").get_accuracy(e, y)


def with_reference(e: torch.Tensor, y: torch.Tensor) -> Any:
    half = len(e) // 2
    return AccuracyCalculator().get_accuracy(e[:half], y[:half], e[half:], y[half:])


def custom_backend(e: torch.Tensor, y: torch.Tensor) -> Any:
    return AccuracyCalculator(knn_func=plain_knn, exclude=("NMI", "AMI")).get_accuracy(e, y)


def accumulated(e: torch.Tensor, y: torch.Tensor) -> Any:
    accumulator = AccuracyAccumulator(num_samples=len(e))
    for start in range(0, len(e), 7):
        accumulator.update(
            e[start : start + 7],
            y[start : start + 7],
            torch.arange(start, start + len(e[start : start + 7])),
        )
    return accumulator.compute()


def searched(e: torch.Tensor, y: torch.Tensor) -> Any:
    (distances, indices), _ = search_knn(plain_knn, e, 3, e, True)
    return {"distances": distances.tolist(), "indices": indices.tolist()}


ENTRY_POINTS: list[Callable[[torch.Tensor, torch.Tensor], Any]] = [
    one_shot,
    with_reference,
    custom_backend,
    accumulated,
    searched,
]


def same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == value, name


@settings(max_examples=25, deadline=None)
@given(
    entry=st.sampled_from(ENTRY_POINTS),
    rows=st.integers(12, 40),
    seed=st.integers(0, 2**16),
    compute_inside=st.booleans(),
)
def test_every_entry_point_takes_inference_tensors(entry, rows, seed, compute_inside) -> None:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (rows,), generator=generator)
    embeddings = labels.unsqueeze(1).float() + torch.randn(rows, 3, generator=generator)
    expected = entry(embeddings, labels)  # ordinary tensors, outside inference mode
    with torch.inference_mode():
        e, y = embeddings.clone(), labels.clone()
        assert e.is_inference() and y.is_inference()
        got = entry(e, y) if compute_inside else None
    if not compute_inside:  # inference tensors used after inference mode ended
        got = entry(e, y)
    same(got, expected)


def test_a_backend_that_changes_an_inference_tensor_is_still_caught() -> None:
    """Without a version counter, the row sums still see an in-place change."""

    def normalizing(query, k, reference=None, ref_includes_query=False):
        query.mul_(2.0)  # allowed on an inference tensor inside inference mode
        return EXACT(query, k, reference, ref_includes_query)

    with torch.inference_mode():
        x = torch.randn(10, 3)
        with pytest.raises(BackendOutputError, match="modified its inputs"):
            search_knn(normalizing, x, 2, x, True)
