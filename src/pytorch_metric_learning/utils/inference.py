"""2.x import path: ``from pytorch_metric_learning.utils.inference import InferenceModel``.

Re-exports only. The faiss helpers load the faiss plugin when called, never at import.
"""

from __future__ import annotations

from ..evaluation import CustomKNN, FaissKMeans, FaissKNN, MatchFinder
from ..evaluation.search._inference_helpers import (
    add_to_index_and_search,
    convert_to_cpu_index,
    convert_to_gpu_index,
    get_topk,
    mask_reshape_knn_idx,
    return_results,
    run_pca,
    try_gpu,
)
from .inference_model import InferenceModel

__all__ = [
    "CustomKNN",
    "FaissKMeans",
    "FaissKNN",
    "InferenceModel",
    "MatchFinder",
    "add_to_index_and_search",
    "convert_to_cpu_index",
    "convert_to_gpu_index",
    "get_topk",
    "mask_reshape_knn_idx",
    "return_results",
    "run_pca",
    "try_gpu",
]
