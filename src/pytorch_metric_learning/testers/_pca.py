"""PCA in PyTorch for the testers' ``pca`` option: standardize, then project.

The projection is fitted once, on the reference of an evaluation, and applied to both its
query and its reference, so that both live in the same basis. Statistics are accumulated
in float64 over row blocks, so fitting needs memory for one block and a
``(dims, dims)`` covariance, never a float64 copy of the whole reference. The statistics are
sums, so a reference sharded across ranks is fitted by summing them across ranks (``reduce``).
"""

from __future__ import annotations

from collections.abc import Callable
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


Reduce = Callable[[torch.Tensor], torch.Tensor]


def fit_pca(
    reference: torch.Tensor, dims: int, owner: str = "PCA", reduce: Reduce | None = None
) -> PCAProjection:
    """Fit a standardize-then-PCA projection of ``reference`` to ``dims`` dimensions.

    Each column is standardized with the reference's mean and population standard
    deviation (a constant column keeps a scale of 1), then projected onto the ``dims``
    eigenvectors of the covariance with the largest eigenvalues, in decreasing order.
    No whitening: component ``i`` keeps its variance. Each component's sign is arbitrary.

    ``reduce`` sums a float64 tensor over the shards of a reference split across ranks
    (e.g. an all-reduce); the fit is then that of the shards' concatenation, on every rank.
    """
    if dims > reference.shape[1]:
        raise invalid("pca", owner, f"at most the embedding size ({reference.shape[1]})", dims)
    total = _identity if reduce is None else reduce
    mean, std, count = _column_moments(reference, total)
    scale = torch.where(std > 0, std, torch.ones_like(std))
    covariance = total(_scatter(reference, mean, scale)) / count
    _, eigenvectors = torch.linalg.eigh(covariance)
    components = eigenvectors.flip(-1)[:, :dims].contiguous()
    return PCAProjection(mean, scale, components)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _column_moments(
    x: torch.Tensor, total: Reduce
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Column means, population standard deviations (float64) and the number of rows."""
    sums = torch.zeros(x.shape[1] + 1, dtype=torch.float64, device=x.device)
    for start in range(0, len(x), _BLOCK_ROWS):
        sums[:-1] += x[start : start + _BLOCK_ROWS].to(torch.float64).sum(0)
    sums[-1] = len(x)
    sums = total(sums)
    mean, count = sums[:-1] / sums[-1], sums[-1]
    squares = torch.zeros_like(mean)
    for start in range(0, len(x), _BLOCK_ROWS):
        centered = x[start : start + _BLOCK_ROWS].to(torch.float64) - mean
        squares += centered.square().sum(0)
    return mean, (total(squares) / count).sqrt(), count


def _scatter(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Sum of the outer products of the standardized rows with themselves, in float64."""
    scatter = torch.zeros((x.shape[1], x.shape[1]), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), _BLOCK_ROWS):
        block = (x[start : start + _BLOCK_ROWS].to(torch.float64) - mean) / scale
        scatter.addmm_(block.T, block)
    return scatter
