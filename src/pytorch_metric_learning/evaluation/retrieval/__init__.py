"""Retrieval accuracy: AccuracyCalculator, the metric functions, per-query values, bootstrap.

Turns neighbour labels into metrics (precision@1, MAP@R, ...) and their intervals. May
import ``search`` and ``clustering``; nothing of verification or distributed.
"""

from __future__ import annotations

from ._per_query import PerQueryValues, cmc_curve
from .accuracy_calculator import AccuracyCalculator
from .binomial import clopper_pearson
from .bootstrap import (
    ConfidenceInterval,
    PairedComparison,
    bootstrap_interval,
    bootstrap_intervals,
    compare_per_query,
    paired_bootstrap,
)

__all__ = [
    "AccuracyCalculator",
    "ConfidenceInterval",
    "PairedComparison",
    "PerQueryValues",
    "bootstrap_interval",
    "bootstrap_intervals",
    "clopper_pearson",
    "cmc_curve",
    "compare_per_query",
    "paired_bootstrap",
]
