"""Exact power-of-two rescaling of embeddings whose magnitude float32 arithmetic cannot hold.

Squared distances of embeddings near 1e20 overflow float32 (1e40 > 3.4e38) and those of
embeddings near 1e-25 underflow to zero, so a search would rank infinities or zeros.
Multiplying by a power of two only changes the exponent, so it is exact: the search runs on
embeddings of magnitude about 1, and the distances are scaled back by the power of two that
the distance's homogeneity implies (``|s x - s y| = s |x - y|``, ``s x . s y = s^2 x . y``).
Distances whose homogeneity is unknown (custom subclasses) are searched as given.
"""

from __future__ import annotations

import logging
import math
import warnings

import torch

from ..._mapped import row_blocks
from ...distances import (
    BaseDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)

__all__ = ["Rescaled", "in_float_range", "largest_magnitude", "rescale"]

logger = logging.getLogger(__name__)

# Inputs whose largest magnitude lies within 2**-SAFE_EXPONENT .. 2**SAFE_EXPONENT are
# searched as given: their squared distances neither overflow nor lose precision to underflow.
SAFE_EXPONENT = 32
_HOMOGENEITY = {LpDistance: 1, DotProductSimilarity: 2, CosineSimilarity: 0, SNRDistance: 0}


class Rescaled:
    """Inputs scaled by ``2**-exponent`` and how to scale the distances back."""

    def __init__(self, query: torch.Tensor, reference: torch.Tensor, output_exponent: float):
        self.query, self.reference, self.output_exponent = query, reference, output_exponent

    def restore(self, distances: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """Scale distances back to the inputs' magnitude and cast them to ``out_dtype``."""
        if self.output_exponent == 0:
            return distances.to(out_dtype)
        restored = _times_power_of_two(distances.double(), self.output_exponent).to(out_dtype)
        if bool((torch.isinf(restored) & torch.isfinite(distances)).any()):
            warnings.warn(
                f"Some k-NN distances exceed the range of {out_dtype} and are returned as inf; "
                "the neighbours were found exactly on rescaled embeddings.",
                RuntimeWarning,
                stacklevel=4,
            )
        tiny = torch.finfo(out_dtype).tiny
        if bool(((restored.abs() < tiny) & (distances != 0)).any()):
            warnings.warn(
                f"Some k-NN distances are below the smallest normal {out_dtype} and are "
                "returned rounded to its subnormals or to 0; the neighbours were found "
                "exactly on rescaled embeddings, in the order of their true distances, so "
                "neighbours returned at one distance may not come in index order.",
                RuntimeWarning,
                stacklevel=4,
            )
        return restored


def rescale(
    distance: BaseDistance | None,
    query: torch.Tensor,
    reference: torch.Tensor,
    largest: float | None = None,
) -> Rescaled:
    """Scale ``query`` and ``reference`` by one power of two when their magnitude needs it.

    ``largest`` is the magnitude to go by (default: the largest of ``query`` and
    ``reference``; a distributed search passes that of every rank). ``reference is query``
    stays true of the results, so self-search is still detected. A ``distance`` of unknown
    homogeneity (or None) leaves the inputs as given.

    Example:
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> x = torch.tensor([[3e20, 0.0], [0.0, 4e20]])
        >>> scaled = rescale(LpDistance(normalize_embeddings=False), x, x)
        >>> float(scaled.query.abs().max()) < 1, scaled.reference is scaled.query
        (True, True)
    """
    degree = None if distance is None else _homogeneity(distance)
    exponent = _exponent(largest_magnitude(query, reference) if largest is None else largest)
    if distance is None or degree is None or exponent == 0:
        return Rescaled(query, reference, 0)
    logger.debug("Rescaling k-NN inputs by 2**%d for float range", -exponent)
    scaled_query = _scaled(query, -exponent)
    scaled_ref = scaled_query if reference is query else _scaled(reference, -exponent)
    return Rescaled(scaled_query, scaled_ref, exponent * degree * distance.power)


def _homogeneity(distance: BaseDistance) -> int | None:
    degree = _HOMOGENEITY.get(type(distance))
    if degree is None:
        return None
    return 0 if distance.normalize_embeddings else degree


def largest_magnitude(*tensors: torch.Tensor) -> float:
    """The largest absolute value in ``tensors`` (0 if they are empty); a tensor passed
    twice (a self-search's query and reference) is read once."""
    found = 0.0
    for number, x in enumerate(tensors):
        if x.numel() and not any(x is earlier for earlier in tensors[:number]):
            for block in row_blocks(x):  # a mapped file block by block, else x whole
                low, high = torch.aminmax(block)  # one pass, no copy (abs() would make one)
                found = max(found, -float(low), float(high))
    return found


def _exponent(largest: float) -> int:
    """The power of two that brings ``largest`` near 1; 0 if it needs no scaling."""
    exponent = math.frexp(largest)[1] if largest > 0 else 0
    return exponent if abs(exponent) > SAFE_EXPONENT else 0


def _scaled(x: torch.Tensor, exponent: int) -> torch.Tensor:
    """``x * 2**exponent``, exact (float64 holds every factor), at least float32."""
    dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return _times_power_of_two(x.double(), exponent).to(dtype)


def _times_power_of_two(values: torch.Tensor, exponent: float) -> torch.Tensor:
    """``values * 2**exponent``, going to inf or 0 where float64 cannot hold the result
    (``2.0**exponent`` alone would raise OverflowError past 2**1023)."""
    while exponent != 0:
        step = max(-1000.0, min(1000.0, exponent))
        values = values * 2.0**step
        exponent -= step
    return values


def in_float_range(x: torch.Tensor, largest: float) -> torch.Tensor:
    """``x``, or ``x`` times the power of two that brings ``largest`` near 1 where squared
    distances at that magnitude would overflow or underflow float32.

    ``largest`` is the largest magnitude of ``x`` and of any rows it is compared with
    (every process's, for a distributed computation), so that all are scaled alike.

    Example:
        >>> float(in_float_range(torch.tensor([3e20]), 3e20).abs().max()) < 1
        True
    """
    exponent = _exponent(largest)
    return _scaled(x, -exponent) if exponent else x
