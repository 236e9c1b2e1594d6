"""The docstring examples of the testers package run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pytorch_metric_learning.testers.base_tester",
    "pytorch_metric_learning.testers.global_embedding_space",
    "pytorch_metric_learning.testers.with_same_parent_label",
    "pytorch_metric_learning.testers.global_two_stream",
    "pytorch_metric_learning.testers.label_mapper",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.attempted > 0
    assert result.failed == 0
