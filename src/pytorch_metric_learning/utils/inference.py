"""2.x import path: ``from pytorch_metric_learning.utils.inference import CustomKNN, MatchFinder``."""

from __future__ import annotations

from ..evaluation import CustomKNN, FaissKMeans, FaissKNN, MatchFinder

__all__ = ["CustomKNN", "FaissKMeans", "FaissKNN", "MatchFinder"]
