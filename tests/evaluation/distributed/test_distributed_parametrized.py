"""Parametrized metric names (recall_at_<K>, ...) across ranks, on a group of one process.

The spawned multi-rank cases in ``_dist_plans`` include them too."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.distributed import DistributedAccuracyCalculator


def test_one_rank_matches_the_single_process_calculator(one_rank_group) -> None:
    generator = torch.Generator().manual_seed(9)
    query = torch.randn(40, 4, generator=generator)
    labels = torch.randint(5, (40,), generator=generator)
    options = {"include": ("recall_at_1", "recall_at_8", "ndcg_at_3", "precision_at_2")}
    expected = AccuracyCalculator(**options).get_accuracy(query, labels)
    got = DistributedAccuracyCalculator(**options).get_accuracy(query, labels)
    assert got == pytest.approx(expected)


def test_per_query_values_are_refused(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(include=("recall_at_1",))
    with pytest.raises(ValueError, match="return_per_query"):
        calc.get_accuracy(
            torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]), return_per_query=True
        )


def test_categories_are_refused(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(include=("recall_at_1",))
    with pytest.raises(ValueError, match="query_categories"):
        calc.get_accuracy(
            torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]), query_categories=[0] * 6
        )
