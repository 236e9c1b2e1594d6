"""Cosine similarity."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .dot_product_similarity import DotProductSimilarity

__all__ = ["CosineSimilarity"]


class CosineSimilarity(DotProductSimilarity):
    """The cosine of the angle between two embeddings: the dot product of unit vectors.

    Example:
        >>> import torch
        >>> s = CosineSimilarity()
        >>> round(s(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 2.0]])).item(), 4)
        0.7071
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("normalize_embeddings", True) is not True:
            raise InvalidArgumentError(
                "The 'normalize_embeddings' parameter of CosineSimilarity must be True; "
                "use DotProductSimilarity(normalize_embeddings=False) for raw dot products. "
                f"Got {kwargs['normalize_embeddings']!r} instead."
            )
        super().__init__(**kwargs)
