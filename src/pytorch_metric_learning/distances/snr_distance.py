"""Signal-to-noise ratio distance."""

from __future__ import annotations

from typing import Any

import torch

from .base_distance import BaseDistance, check_not_inverted

__all__ = ["SNRDistance"]


class SNRDistance(BaseDistance):
    """``var(x - y) / var(x)``: the noise-to-signal ratio of ``y`` seen as a noisy ``x``.

    Variances are unbiased (divided by ``dims - 1``), as ``torch.var`` computes them.
    From "Signal-to-Noise Ratio: A Robust Distance Metric for Deep Metric Learning"
    (Yuan et al., CVPR 2019).

    Example:
        >>> import torch
        >>> d = SNRDistance(normalize_embeddings=False)
        >>> d(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0]])).tolist()
        [[0.0]]
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_not_inverted(self, "SNRDistance")

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        query_centered = query - query.mean(dim=1, keepdim=True)
        ref_centered = ref - ref.mean(dim=1, keepdim=True)
        query_sq = (query_centered * query_centered).sum(dim=1, keepdim=True)
        ref_sq = (ref_centered * ref_centered).sum(dim=1)
        noise = (query_sq + ref_sq - 2 * (query_centered @ ref_centered.T)).clamp_min_(0)
        return noise / query_sq

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.var(x - y, dim=1) / torch.var(x, dim=1)
