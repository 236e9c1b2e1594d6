"""Faiss backends for pytorch-metric-learning: k-NN search, k-means and PCA.

The core finds these through its registry under the name ``faiss``::

    from pytorch_metric_learning.evaluation import FaissKNN, load_knn_func

    knn = FaissKNN()  # the class defined here
    approximate = load_knn_func({"name": "faiss", "index": "HNSW32", "efSearch": 128})

This package never changes environment variables (see the README's macOS note).
"""

from __future__ import annotations

from .errors import IndexFileNotFoundError
from .kmeans import FaissKMeans
from .knn import FaissKNN
from .pca import faiss_pca, standardize

__all__ = ["FaissKMeans", "FaissKNN", "IndexFileNotFoundError", "faiss_pca", "standardize"]

__version__ = "3.0.0.dev0"
