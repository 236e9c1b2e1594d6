"""The ``pml-eval`` command (also ``python -m pytorch_metric_learning``).

Subcommands: ``evaluate`` (retrieval and clustering metrics of embedding files),
``threshold`` (a verification threshold from scored pairs), ``backends`` (what is
installed), ``demo`` (train, validate, test and plot on the UCI digits).
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
