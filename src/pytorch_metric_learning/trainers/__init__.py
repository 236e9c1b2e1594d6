"""Trainers: a small training loop that calls the hooks of ``utils.logging_presets``."""

from __future__ import annotations

from .base_trainer import BaseTrainer
from .metric_loss_only import MetricLossOnly
from .train_with_classifier import TrainWithClassifier

__all__ = ["BaseTrainer", "MetricLossOnly", "TrainWithClassifier"]
