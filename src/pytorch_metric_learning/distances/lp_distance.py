"""Minkowski (L_p) distance."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidArgumentError
from .base_distance import BaseDistance

__all__ = ["LpDistance"]


class LpDistance(BaseDistance):
    """The L_p distance ``||x - y||_p``; with ``power=2`` and ``p=2``, squared Euclidean.

    Example:
        >>> import torch
        >>> d = LpDistance(normalize_embeddings=False, power=2)
        >>> d(torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0]])).tolist()
        [[25.0]]
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.is_inverted:
            raise InvalidArgumentError(
                "The 'is_inverted' parameter of LpDistance must be False (smaller is closer). "
                "Got True instead."
            )

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return torch.cdist(query, ref, p=self.p)

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x - y, ord=self.p, dim=1)
