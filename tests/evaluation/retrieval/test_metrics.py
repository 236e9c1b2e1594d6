"""Per-query metric functions against plain loops over random relevance matrices."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.evaluation.retrieval import metrics


def loop_values(relevance, num_relevant):
    """Each metric for each row, by plain loops."""
    rows = []
    for rel, big_r in zip(relevance.tolist(), num_relevant.tolist()):
        k = len(rel)
        cutoff = min(big_r, k)
        hits, ap_r, ap = 0, 0.0, 0.0
        for i, is_rel in enumerate(rel):
            if is_rel:
                hits += 1
                ap += hits / (i + 1)
                if i < cutoff:
                    ap_r += hits / (i + 1)
        first = next((i for i, is_rel in enumerate(rel) if is_rel), None)
        rows.append(
            {
                "precision_at_1": float(rel[0]),
                "r_precision": sum(rel[:cutoff]) / cutoff,
                "mean_average_precision_at_r": ap_r / big_r,
                "mean_average_precision": ap / big_r,
                "mean_reciprocal_rank": 0.0 if first is None else 1 / (first + 1),
            }
        )
    return rows


@st.composite
def relevance_and_counts(draw):
    n = draw(st.integers(1, 12))
    k = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    relevance = torch.rand(n, k, generator=generator) < draw(st.floats(0.0, 1.0))
    # R is at least the relevant count among the k (they are all references).
    extra = torch.randint(0, 5, (n,), generator=generator)
    num_relevant = (relevance.sum(dim=1) + extra).clamp(min=1)
    return relevance, num_relevant


@given(relevance_and_counts(), st.sampled_from([1, 7, 2**20]))
def test_metrics_match_plain_loops(data, block_elements):
    """Also with the precision sums taken over blocks of one or a few rows."""
    relevance, num_relevant = data
    want = loop_values(relevance, num_relevant)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics, "_BLOCK_ELEMENTS", block_elements)
        got = _metric_values(relevance, num_relevant)
    for name, values in got.items():
        assert values.dtype == torch.float64
        assert values.tolist() == pytest.approx([row[name] for row in want], abs=1e-15), name


def _metric_values(relevance, num_relevant):
    return {
        "precision_at_1": metrics.precision_at_1(relevance),
        "r_precision": metrics.r_precision(relevance, num_relevant),
        "mean_average_precision_at_r": metrics.mean_average_precision_at_r(relevance, num_relevant),
        "mean_average_precision": metrics.mean_average_precision(relevance, num_relevant),
        "mean_reciprocal_rank": metrics.mean_reciprocal_rank(relevance),
    }


def test_perfect_retrieval_is_one():
    relevance = torch.tensor([[True, True, False], [True, False, False]])
    num_relevant = torch.tensor([2, 1])
    for fn in (metrics.r_precision, metrics.mean_average_precision_at_r):
        assert fn(relevance, num_relevant).tolist() == [1.0, 1.0]


def test_average_and_per_class():
    values = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    assert metrics.average(values) == 0.625
    assert math.isnan(metrics.average(values[:0]))
    per_class = metrics.average_per_class(values, torch.tensor([3, 0, 3, 1]), 4)
    assert per_class.tolist() == [0.0, 1.0, 0.75]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: metrics.precision_at_1(torch.ones(2, 3)), TypeError),
        (lambda: metrics.precision_at_1(torch.ones(2, 0, dtype=torch.bool)), ValueError),
        (lambda: metrics.precision_at_1(torch.ones(3, dtype=torch.bool)), ValueError),
        (
            lambda: metrics.r_precision(torch.ones(2, 3, dtype=torch.bool), torch.tensor([1])),
            ValueError,
        ),
        (
            lambda: metrics.r_precision(torch.ones(2, 3, dtype=torch.bool), torch.tensor([1, 0])),
            ValueError,
        ),
        (
            lambda: metrics.mean_average_precision(
                torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, 2.0])
            ),
            ValueError,
        ),
    ],
)
def test_invalid_inputs(call, error):
    with pytest.raises(error):
        call()


def test_docstring_examples():
    import doctest

    from pytorch_metric_learning.evaluation.retrieval import metrics as module

    assert doctest.testmod(module, raise_on_error=False).failed == 0
