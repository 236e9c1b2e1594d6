"""Evaluation for embedding models: retrieval metrics, clustering metrics and thresholds."""

from __future__ import annotations

import logging

__version__ = "3.0.0.dev0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["__version__"]
