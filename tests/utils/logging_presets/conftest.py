"""Fixtures shared by the hook and record tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A folder in memory where the system has one: SQLite's own syncs would dominate on a
    busy disk."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as name:
        yield Path(name)
