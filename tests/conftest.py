"""The core's test ordering (hypothesis profiles and fixtures: the repository's conftest.py)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first, so that with several xdist workers the longest start at once."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
