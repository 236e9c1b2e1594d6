"""Distances and similarities between embeddings."""

from __future__ import annotations

from .base_distance import BaseDistance
from .batched_distance import BatchedDistance
from .cosine_similarity import CosineSimilarity
from .dot_product_similarity import DotProductSimilarity
from .lp_distance import LpDistance
from .snr_distance import SNRDistance

__all__ = [
    "BaseDistance",
    "BatchedDistance",
    "CosineSimilarity",
    "DotProductSimilarity",
    "LpDistance",
    "SNRDistance",
]
