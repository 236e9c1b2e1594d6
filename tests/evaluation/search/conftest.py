"""Every search test starts and ends with an empty in-process backend registry."""

from __future__ import annotations

import pytest

from pytorch_metric_learning.evaluation.search import registry


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._reset_for_tests()
    yield
    registry._reset_for_tests()
