"""The k-NN search: the backend contract, the registry that finds backends, CustomKNN.

Holds the ``KNNFunc``/``KMeansFunc`` protocols, entry-point discovery, the exact blocked
search engine and the checks of a backend's output. Imports only ``distances`` and the
package's shared helpers: nothing of retrieval, clustering, verification or distributed.
"""

from __future__ import annotations

from ._checked_search import ApproximateSearchWarning
from ._plugin_proxy import FaissKMeans, FaissKNN
from .exclusion import Exclusion
from .knn import CustomKNN, remove_self_matches
from .knn_output import check_knn_backend, check_knn_output
from .protocols import KMeansFunc, KNNFunc, knn_is_inverted
from .registry import (
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
)

__all__ = [
    "ApproximateSearchWarning",
    "CustomKNN",
    "Exclusion",
    "FaissKMeans",
    "FaissKNN",
    "KMeansFunc",
    "KNNFunc",
    "check_knn_backend",
    "check_knn_output",
    "knn_is_inverted",
    "list_kmeans_backends",
    "list_knn_backends",
    "load_kmeans_func",
    "load_knn_func",
    "register_kmeans_backend",
    "register_knn_backend",
    "remove_self_matches",
]
