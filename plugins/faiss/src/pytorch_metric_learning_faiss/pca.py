"""Principal component analysis with ``faiss.PCAMatrix``, for the testers' ``pca`` option."""

from __future__ import annotations

import faiss
import torch

from pytorch_metric_learning._validation import check_embeddings, check_positive_int
from pytorch_metric_learning.errors import InvalidArgumentError

from ._interop import faiss_errors, from_numpy, to_float32_numpy

__all__ = ["faiss_pca", "standardize"]

_OWNER = "faiss_pca"


def standardize(x: torch.Tensor) -> torch.Tensor:
    """Shift each column to zero mean and scale it to unit (population) variance.

    Constant columns are only shifted, so they become zeros instead of NaNs.

    Example:
        >>> standardize(torch.tensor([[1.0, 5.0], [3.0, 5.0]])).tolist()
        [[-1.0, 0.0], [1.0, 0.0]]
    """
    mean = x.mean(dim=0, keepdim=True)
    std = x.std(dim=0, correction=0, keepdim=True)
    return (x - mean) / torch.where(std > 0, std, torch.ones_like(std))


@torch.no_grad()
def faiss_pca(x: torch.Tensor, dims: int) -> torch.Tensor:
    """Standardize the columns of ``x``, then project its rows onto the first ``dims`` components.

    faiss trains a ``PCAMatrix`` on a float32 CPU copy; components are ordered by explained
    variance (each one's sign is arbitrary). Returns a ``(len(x), dims)`` tensor of x's
    dtype on x's device.

    Args:
        x: A 2-D floating-point tensor of finite values, one row per sample.
        dims: The number of components to keep, at most ``min(x.shape)``.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.0, 0.0], [1.0, 1.1], [2.0, 1.9], [3.0, 3.0]])
        >>> faiss_pca(x, 1).shape
        torch.Size([4, 1])
    """
    check_embeddings(x, "x", _OWNER)
    dims = check_positive_int(dims, "dims", _OWNER)
    if dims > min(x.shape):
        raise InvalidArgumentError(
            f"The 'dims' parameter of {_OWNER} must be at most the number of rows and of "
            f"columns of x {tuple(x.shape)}. Got {dims} instead."
        )
    data = to_float32_numpy(standardize(x.to(torch.float32)))
    with faiss_errors(_OWNER, f"compute a {dims}-component PCA of {tuple(x.shape)} data"):
        pca = faiss.PCAMatrix(data.shape[1], dims)
        pca.train(data)
        projected = pca.apply(data)
    return from_numpy(projected, x.dtype, x.device)
