"""2.x import path: ``from pytorch_metric_learning.utils.inference import InferenceModel``.

Re-exports only. The faiss helpers load the faiss plugin when called, never at import.
"""

from __future__ import annotations

from ..evaluation import CustomKNN, FaissKMeans, FaissKNN, MatchFinder
from ..evaluation.search import _inference_helpers
from ..evaluation.search._inference_helpers import *  # noqa: F403
from .inference_model import InferenceModel

__all__ = [
    "CustomKNN",
    "FaissKMeans",
    "FaissKNN",
    "InferenceModel",
    "MatchFinder",
    *_inference_helpers.__all__,
]
