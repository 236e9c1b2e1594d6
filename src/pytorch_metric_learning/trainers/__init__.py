"""Trainers: a small training loop that calls the hooks of ``utils.logging_presets``."""

from __future__ import annotations

from typing import Any

from .base_trainer import BaseTrainer
from .metric_loss_only import MetricLossOnly
from .train_with_classifier import TrainWithClassifier

__all__ = ["BaseTrainer", "MetricLossOnly", "TrainWithClassifier"]


def __getattr__(name: str) -> Any:
    """2.x's other trainers (``CascadedEmbeddings``, ...) raise an error that says why."""
    from .._missing_2x import MISSING_TRAINERS, raise_missing

    if name in MISSING_TRAINERS:
        raise_missing(MISSING_TRAINERS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
