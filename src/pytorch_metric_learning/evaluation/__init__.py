"""Nearest-neighbour search, thresholds, clustering and accuracy of embeddings.

Importing this package imports neither faiss nor scikit-learn.
"""

from __future__ import annotations

from ._plugin_proxy import FaissKMeans, FaissKNN
from .accuracy_calculator import AccuracyCalculator
from .kmeans import TorchKMeans
from .knn import CustomKNN
from .mutual_information import adjusted_mutual_info, normalized_mutual_info
from .protocols import KMeansFunc, KNNFunc
from .registry import (
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
)

__all__ = [
    "CustomKNN",
    "FaissKMeans",
    "FaissKNN",
    "KMeansFunc",
    "KNNFunc",
    "list_kmeans_backends",
    "list_knn_backends",
    "load_kmeans_func",
    "load_knn_func",
    "register_kmeans_backend",
    "register_knn_backend",
    "AccuracyCalculator",
    "TorchKMeans",
    "adjusted_mutual_info",
    "normalized_mutual_info",
]
