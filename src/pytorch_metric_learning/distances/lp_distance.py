"""Minkowski (L_p) distance."""

from __future__ import annotations

from typing import Any

import torch

from ._zero_safe import zero_safe_power, zero_safe_sqrt
from .base_distance import BaseDistance, check_not_inverted

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
        check_not_inverted(self, "LpDistance")

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        if self.p == 2:
            return zero_safe_sqrt(squared_euclidean(query, ref))
        return torch.cdist(query, ref, p=self.p)

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x - y, ord=self.p, dim=1)

    def powered_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        if self.p == 2 and type(self).compute_mat is LpDistance.compute_mat:
            return power_of_squared(squared_euclidean(query, ref), self.power)
        return super().powered_mat(query, ref)

    def powered_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.p == 2 and type(self).compute_pairwise is LpDistance.compute_pairwise:
            diff = x - y
            return power_of_squared((diff * diff).sum(dim=1), self.power)
        return super().powered_pairwise(x, y)


# Below this many elements in the (rows, cols, dims) difference tensor, squared distances
# are summed directly (exact); above it, |q|^2 + |r|^2 - 2 q.r uses one matrix product.
_DIRECT_LIMIT = 2**20


def squared_euclidean(query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The matrix of squared Euclidean distances between rows of ``query`` and ``ref``.

    Example:
        >>> squared_euclidean(torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0]])).tolist()
        [[25.0]]
    """
    if query.shape[0] * ref.shape[0] * query.shape[1] <= _DIRECT_LIMIT:
        diff = query.unsqueeze(1) - ref.unsqueeze(0)
        return (diff * diff).sum(dim=2)
    query_sq = (query * query).sum(dim=1, keepdim=True)
    ref_sq = (ref * ref).sum(dim=1)
    return torch.addmm(ref_sq, query, ref.T, alpha=-2).add_(query_sq).clamp_min_(0)


def power_of_squared(squared: torch.Tensor, power: float) -> torch.Tensor:
    """Raise distances given as squares to ``power`` (no square root for power 2).

    Gradients are finite where a distance is 0 (see :mod:`._zero_safe`).
    """
    if power == 2:
        return squared
    if power == 1:
        return zero_safe_sqrt(squared)
    return zero_safe_power(squared, power / 2)
