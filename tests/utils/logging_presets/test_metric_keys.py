"""Matching metric names to the keys testers produce."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pytorch_metric_learning.utils.logging_presets import resolve_metric_key
from pytorch_metric_learning.utils.logging_presets.metric_keys import is_better, numeric_accuracies


@pytest.mark.parametrize(
    "metric, keys, expected",
    [
        (
            "precision_at_1",
            ["precision_at_1_level0", "r_precision_level0"],
            "precision_at_1_level0",
        ),
        ("r_precision", ["precision_at_1_level0", "r_precision_level0"], "r_precision_level0"),
        (
            "precision_at_1",
            ["precision_at_1_level2", "precision_at_1_level1"],
            "precision_at_1_level1",
        ),
        (
            "precision_at_1",
            ["precision_at_1_level0", "AVERAGE_precision_at_1"],
            "AVERAGE_precision_at_1",
        ),
        ("NMI", ["NMI_level0_pca8", "AMI_level0_pca8"], "NMI_level0_pca8"),
        (
            "precision_at_1_level3",
            ["precision_at_1_level0", "precision_at_1_level3"],
            "precision_at_1_level3",
        ),
        ("mean_average_precision", ["mean_average_precision_at_r_level0"], None),
        ("precision_at_1", ["precision_at_10_level0", "xprecision_at_1_level0"], None),
        ("a.b", ["axb_level0"], None),
        ("precision_at_1", [], None),
    ],
)
def test_resolve_metric_key(metric, keys, expected) -> None:
    assert resolve_metric_key(metric, keys) == expected


def test_numeric_accuracies() -> None:
    table = {
        "epoch": 4,
        "a": 1,
        "b": np.float64(0.5),
        "c": torch.tensor(0.25),
        "d": [1, 2],
        "e": torch.ones(3),
        "f": None,
        "g": False,
    }
    assert numeric_accuracies(table) == {"a": 1.0, "b": 0.5, "c": 0.25}


def test_is_better() -> None:
    assert is_better(0.1, None) and is_better(0.2, 0.1)
    assert not is_better(0.1, 0.1) and not is_better(0.0, 0.1)
    assert not is_better(math.nan, None) and not is_better(math.nan, 0.1)
    assert is_better(-math.inf, None)
