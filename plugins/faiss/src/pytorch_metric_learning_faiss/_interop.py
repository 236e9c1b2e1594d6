"""Moving tensors into and out of faiss, and turning faiss failures into this library's errors."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from pytorch_metric_learning.errors import BackendRuntimeError, PMLError

__all__ = ["LOGGER_PREFIX", "faiss_errors", "from_numpy", "to_float32_numpy"]

# Loggers live under the core's logger, so configuring "pytorch_metric_learning" covers them.
LOGGER_PREFIX = "pytorch_metric_learning.faiss"

logger = logging.getLogger(f"{LOGGER_PREFIX}.interop")


def to_float32_numpy(x: torch.Tensor) -> np.ndarray:
    """A C-contiguous float32 NumPy array with the values of ``x`` (a CPU copy if needed)."""
    return np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float32).numpy())


def from_numpy(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of ``dtype`` on ``device`` holding ``array``."""
    return torch.from_numpy(array).to(device=device, dtype=dtype)


@contextmanager
def faiss_errors(owner: str, action: str) -> Iterator[None]:
    """Re-raise a faiss ``RuntimeError`` as :class:`BackendRuntimeError`, chaining the original.

    This library's own errors (some of which are ``RuntimeError``s) pass through unchanged.
    """
    try:
        yield
    except PMLError:
        raise
    except RuntimeError as error:
        detail = str(error).strip() or type(error).__name__
        logger.debug("faiss failed to %s", action, exc_info=True)
        raise BackendRuntimeError(
            f"{owner} could not {action}: faiss reported: {detail}"
        ) from error
