"""PCA in PyTorch for the testers' ``pca`` option: standardize, then project.

The projection is fitted once, on the reference of an evaluation, and applied to both its
query and its reference, so that both live in the same basis. Statistics are accumulated
in float64 over row blocks, so fitting needs memory for one block and a
``(dims, dims)`` covariance, never a float64 copy of the whole reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validation import invalid

__all__ = ["PCAProjection", "fit_pca"]

# Rows per block when accumulating statistics and projecting.
_BLOCK_ROWS = 16384


class PCAProjection(NamedTuple):
    """An affine map ``x -> ((x - mean) / scale) @ components``."""

    mean: torch.Tensor
    scale: torch.Tensor
    components: torch.Tensor

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Project the rows of ``x``; the result has ``x``'s dtype and device."""
        weight = self.components / self.scale[:, None]
        bias = -(self.mean / self.scale) @ self.components
        out = torch.empty((len(x), weight.shape[1]), dtype=x.dtype, device=x.device)
        for start in range(0, len(x), _BLOCK_ROWS):
            block = x[start : start + _BLOCK_ROWS].to(torch.float64)
            out[start : start + _BLOCK_ROWS] = torch.addmm(bias, block, weight)
        return out


def fit_pca(reference: torch.Tensor, dims: int, owner: str = "PCA") -> PCAProjection:
    """Fit a standardize-then-PCA projection of ``reference`` to ``dims`` dimensions.

    Each column is standardized with the reference's mean and population standard
    deviation (a constant column keeps a scale of 1), then projected onto the ``dims``
    eigenvectors of the covariance with the largest eigenvalues, in decreasing order.
    No whitening: component ``i`` keeps its variance. Each component's sign is arbitrary.
    """
    if dims > reference.shape[1]:
        raise invalid("pca", owner, f"at most the embedding size ({reference.shape[1]})", dims)
    mean, std = _column_moments(reference)
    scale = torch.where(std > 0, std, torch.ones_like(std))
    covariance = _covariance(reference, mean, scale)
    _, eigenvectors = torch.linalg.eigh(covariance)
    components = eigenvectors.flip(-1)[:, :dims].contiguous()
    return PCAProjection(mean, scale, components)


def _column_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and population standard deviations, in float64."""
    total = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, len(x), _BLOCK_ROWS):
        total += x[start : start + _BLOCK_ROWS].to(torch.float64).sum(0)
    mean = total / len(x)
    squares = torch.zeros_like(mean)
    for start in range(0, len(x), _BLOCK_ROWS):
        centered = x[start : start + _BLOCK_ROWS].to(torch.float64) - mean
        squares += centered.square().sum(0)
    return mean, (squares / len(x)).sqrt()


def _covariance(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Covariance of the standardized rows (population normalization), in float64."""
    covariance = torch.zeros((x.shape[1], x.shape[1]), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), _BLOCK_ROWS):
        block = (x[start : start + _BLOCK_ROWS].to(torch.float64) - mean) / scale
        covariance.addmm_(block.T, block)
    return covariance / len(x)
