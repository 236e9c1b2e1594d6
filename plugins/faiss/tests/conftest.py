"""Hypothesis profiles of the faiss plugin's tests (the same as the core's)."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
