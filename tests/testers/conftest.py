"""Fixtures of the testers' tests."""

from __future__ import annotations

import pytest
from tester_helpers import SpyCalculator


@pytest.fixture
def spy() -> SpyCalculator:
    return SpyCalculator()
