"""Clustering of embeddings: k-means (Lloyd) and the mutual information of two labelings.

May import ``search`` (value rescaling) and the package's shared helpers; nothing of
retrieval, verification or distributed.
"""

from __future__ import annotations

from .kmeans import TorchKMeans
from .mutual_information import adjusted_mutual_info, normalized_mutual_info

__all__ = ["TorchKMeans", "adjusted_mutual_info", "normalized_mutual_info"]
