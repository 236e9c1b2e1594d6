"""Test settings shared by the core's tests and the faiss plugin's (both run from here)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _fresh_notice_cache(tmp_path_factory, monkeypatch):
    """Notices shown "once per environment" are remembered per test, not in the user's cache."""
    monkeypatch.setenv("PML_CACHE_DIR", str(tmp_path_factory.mktemp("pml_cache")))
