"""2.x import path: ``from pytorch_metric_learning.utils.common_functions import LabelMapper``."""

from __future__ import annotations

from ..testers.label_mapper import LabelMapper

__all__ = ["LabelMapper"]
