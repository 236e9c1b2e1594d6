"""Apply a distance to row blocks of the query, for matrices too large to hold at once."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._validation import check_positive_int, invalid
from ..errors import InvalidArgumentError, InvalidTypeError
from .base_distance import BaseDistance

__all__ = ["BatchedDistance"]

IterFn = Callable[[torch.Tensor, int, int], Any]


class BatchedDistance(torch.nn.Module):
    """Compute ``distance(query[s:e], ref)`` block by block and hand each to ``iter_fn``.

    A ``torch.nn.Module``, as in 2.x.

    Args:
        distance: The distance to apply.
        iter_fn: Called as ``iter_fn(block, s, e)`` for each block of query rows ``s:e``.
            May be None at construction (2.x's documented default) and set later as
            ``batched.iter_fn = fn``; calling with no ``iter_fn`` raises
            ``InvalidArgumentError``.
        batch_size: Query rows per block.

    Other attributes (``is_inverted``, ``pairwise``, ...) are those of ``distance``.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> minima = []
        >>> batched = BatchedDistance(LpDistance(), lambda m, s, e: minima.append(m.min(1).values), 2)
        >>> batched(torch.randn(5, 3), torch.randn(4, 3))
        >>> len(minima)
        3
    """

    distance: BaseDistance
    iter_fn: IterFn | None

    def __init__(
        self, distance: BaseDistance, iter_fn: IterFn | None = None, batch_size: int = 32
    ) -> None:
        super().__init__()
        if not isinstance(distance, BaseDistance):
            raise invalid(
                "distance", "BatchedDistance", "a BaseDistance", distance, InvalidTypeError
            )
        if iter_fn is not None and not callable(iter_fn):
            raise invalid(
                "iter_fn", "BatchedDistance", "a callable or None", iter_fn, InvalidTypeError
            )
        self.distance = distance
        self.iter_fn = iter_fn
        self.batch_size = check_positive_int(batch_size, "batch_size", "BatchedDistance")

    def forward(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None = None) -> None:
        """Call ``iter_fn`` on each block of the ``(len(query_emb), len(ref_emb))`` matrix."""
        iter_fn = self.iter_fn
        if iter_fn is None:
            raise InvalidArgumentError(
                "The 'iter_fn' of BatchedDistance must be set before it is called "
                "(batched.iter_fn = fn, called as fn(block, start, end)). Got None instead."
            )
        ref_emb = query_emb if ref_emb is None else ref_emb
        for start in range(0, len(query_emb), self.batch_size):
            end = min(start + self.batch_size, len(query_emb))
            iter_fn(self.distance(query_emb[start:end], ref_emb), start, end)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "distance":
                raise
        return getattr(self.distance, name)
