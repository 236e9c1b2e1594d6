"""Dot-product similarity."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidArgumentError
from .base_distance import BaseDistance

__all__ = ["DotProductSimilarity"]


class DotProductSimilarity(BaseDistance):
    """The dot product ``x . y``: larger is more alike (``is_inverted=True``).

    Embeddings are normalized by default, as in pytorch-metric-learning 2.x; pass
    ``normalize_embeddings=False`` for the raw inner product.

    Example:
        >>> import torch
        >>> s = DotProductSimilarity(normalize_embeddings=False)
        >>> s(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])).tolist()
        [[11.0]]
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("is_inverted", True) is not True:
            raise InvalidArgumentError(
                f"The 'is_inverted' parameter of {type(self).__name__} must be True "
                f"(larger is more alike). Got {kwargs['is_inverted']!r} instead."
            )
        kwargs["is_inverted"] = True
        super().__init__(**kwargs)

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return query @ ref.T

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * y).sum(dim=1)
