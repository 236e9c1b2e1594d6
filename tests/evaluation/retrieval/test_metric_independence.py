"""A metric's value never depends on which other metrics are asked for, to the last bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.evaluation import AccuracyCalculator

# Built-in and parametrized metrics whose searched k differs: asking for them together
# widens the neighbour lists every other metric is computed from.
METRICS = [
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "recall_at_3",
    "precision_at_2",
    "ndcg_at_4",
    "mean_average_precision_at_5",
    "recall_at_40",
]


@st.composite
def tied_data(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """A small integer grid repeated many times (every distance tied), random labels."""
    side = draw(st.integers(2, 3))
    copies = draw(st.integers(3, 30))
    grid = torch.tensor([[x, y] for x in range(side) for y in range(side)], dtype=torch.float64)
    embeddings = grid.repeat(copies, 1)
    labels = draw(st.lists(st.integers(0, 4), min_size=len(embeddings), max_size=len(embeddings)))
    return embeddings, torch.tensor(labels)


# The attack's case: a 3x3 grid 30 times; MAP@R changed in the last bit beside MAP.
_GRID = torch.tensor([[x, y] for x in range(3) for y in range(3)], dtype=torch.float64)
_ATTACK = (_GRID.repeat(30, 1), torch.from_numpy(np.random.default_rng(3).integers(0, 5, 270)))


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(data=tied_data(), subset=st.sets(st.sampled_from(METRICS), min_size=1, max_size=4))
@example(data=_ATTACK, subset={"mean_average_precision_at_r", "ndcg_at_4"})
def test_a_metric_alone_equals_it_among_others(
    data: tuple[torch.Tensor, torch.Tensor], subset: set[str]
) -> None:
    embeddings, labels = data
    together = AccuracyCalculator(include=METRICS).get_accuracy(embeddings, labels)
    for name in subset:
        alone = AccuracyCalculator(include=[name]).get_accuracy(embeddings, labels)
        assert alone[name] == together[name], name
