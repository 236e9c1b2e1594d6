"""Evaluation for embedding models: retrieval metrics, clustering metrics and thresholds."""

from __future__ import annotations

import logging

from . import _logging

__version__ = "3.0.0.dev0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
_logging.install()  # records also reach the 2.x logger name ("PML"); see _logging

__all__ = ["__version__"]
