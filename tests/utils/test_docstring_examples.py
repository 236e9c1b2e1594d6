"""The docstring examples of the training-loop modules run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pytorch_metric_learning.utils.checkpoints",
    "pytorch_metric_learning.utils.record_keeping",
    "pytorch_metric_learning.utils.logging_presets.hook_container",
    "pytorch_metric_learning.utils.logging_presets.metric_keys",
    "pytorch_metric_learning.utils.logging_presets.presets",
    "pytorch_metric_learning.utils.logging_presets.training_state",
    "pytorch_metric_learning.trainers.metric_loss_only",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.attempted > 0
    assert result.failed == 0
