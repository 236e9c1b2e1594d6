"""Exact k-nearest-neighbour search in PyTorch."""

from __future__ import annotations

import logging

import torch

from .._validation import (
    check_finite,
    check_matrix,
    check_positive_int,
    check_same_device,
    invalid,
)
from ..distances import BaseDistance, LpDistance
from ..distances.lp_distance import power_of_squared as _power_of_squared
from ..errors import InvalidArgumentError, InvalidTypeError
from ._topk import topk

__all__ = ["CustomKNN", "default_custom_knn", "remove_self_matches"]

logger = logging.getLogger(__name__)


class CustomKNN:
    """Exact k-NN search with any distance of :mod:`pytorch_metric_learning.distances`.

    Args:
        distance: Similarities (``is_inverted=True``) select the largest values, distances
            the smallest. Normalization follows ``distance.normalize_embeddings``.
        batch_size: If set, query rows are searched in blocks of this many, so peak memory
            is one ``(batch_size, len(reference))`` block plus the outputs.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
        >>> distances, indices = knn(torch.tensor([[0.0, 0.0]]), 1, torch.tensor([[0.0, 1.0]]))
        >>> indices.tolist(), distances.tolist()
        ([[0]], [[1.0]])
    """

    def __init__(self, distance: BaseDistance, batch_size: int | None = None) -> None:
        if not isinstance(distance, BaseDistance):
            raise invalid("distance", "CustomKNN", "a BaseDistance", distance, InvalidTypeError)
        if batch_size is not None:
            batch_size = check_positive_int(batch_size, "batch_size", "CustomKNN")
        self.distance = distance
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"CustomKNN({self.distance!r}, batch_size={self.batch_size})"

    @torch.no_grad()
    def __call__(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(distances, indices)`` of the ``k`` nearest reference rows, nearest first.

        ``reference=None`` searches ``query`` itself.
        """
        query, reference = check_search_inputs(query, reference, "CustomKNN")
        search_k = check_search_k(k, len(reference), ref_includes_query, "CustomKNN")
        logger.debug(
            "CustomKNN: %d queries, %d references, k=%d, %s",
            len(query),
            len(reference),
            k,
            self.distance,
        )
        prepared_query, prepared_ref, out_dtype = self.distance.prepare(query, reference)
        if _uses_fast_euclidean(self.distance):
            distances, indices = self._search_euclidean(prepared_query, prepared_ref, search_k)
        else:
            distances, indices = self._search_generic(prepared_query, prepared_ref, search_k)
        distances = distances.to(out_dtype)
        if ref_includes_query:
            return remove_self_matches(distances, indices)
        return distances, indices

    def _blocks(self, num_rows: int) -> range:
        step = self.batch_size or max(num_rows, 1)
        return range(0, num_rows, step)

    def _search_generic(
        self, query: torch.Tensor, ref: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        distances, indices = _empty_outputs(query, ref, k)
        for start in self._blocks(len(query)):
            block = query[start : start + (self.batch_size or len(query))]
            values = self.distance.powered_mat(block, ref)
            top_values, top_indices = topk(values, k, largest=self.distance.is_inverted)
            distances[start : start + len(block)] = top_values
            indices[start : start + len(block)] = top_indices
        return distances, indices

    def _search_euclidean(
        self, query: torch.Tensor, ref: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank by ``|r|^2 - 2 q.r`` (one GEMM per block); add ``|q|^2`` to the k kept."""
        distances, indices = _empty_outputs(query, ref, k)
        ref_sq = (ref * ref).sum(dim=1)
        query_sq = (query * query).sum(dim=1, keepdim=True)
        rows = self.batch_size or len(query)
        buffer = torch.empty(
            (min(rows, len(query)), len(ref)), dtype=query.dtype, device=query.device
        )
        for start in self._blocks(len(query)):
            block = query[start : start + rows]
            scores = torch.addmm(ref_sq, block, ref.T, alpha=-2, out=buffer[: len(block)])
            top_values, top_indices = topk(scores, k, largest=False)
            squared = top_values.add_(query_sq[start : start + rows]).clamp_min_(0)
            distances[start : start + len(block)] = _power_of_squared(squared, self.distance.power)
            indices[start : start + len(block)] = top_indices
        return distances, indices


def default_custom_knn(
    distance: BaseDistance | None = None, batch_size: int | None = 256
) -> CustomKNN:
    """The ``custom`` backend: exact squared Euclidean search unless ``distance`` is given.

    Example:
        >>> default_custom_knn()
        CustomKNN(LpDistance(normalize_embeddings=False, p=2, power=2, is_inverted=False), batch_size=256)
    """
    if distance is None:
        distance = LpDistance(normalize_embeddings=False, power=2)
    return CustomKNN(distance, batch_size=batch_size)


def check_search_inputs(
    query: torch.Tensor, reference: torch.Tensor | None, owner: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a k-NN query and reference; ``reference=None`` means the query itself."""
    check_matrix(query, "query", owner)
    if reference is None:
        return check_finite(query, "query", owner), query
    check_matrix(reference, "reference", owner)
    check_same_device(query, reference, "query and reference", owner)
    if query.shape[1] != reference.shape[1]:
        raise InvalidArgumentError(
            f"The query and reference of {owner} must have the same number of columns. "
            f"Got {query.shape[1]} and {reference.shape[1]} instead."
        )
    return check_finite(query, "query", owner), check_finite(reference, "reference", owner)


def check_search_k(k: int, num_reference: int, ref_includes_query: bool, owner: str) -> int:
    """Validate ``k``; return how many neighbours to search (``k + 1`` to drop self matches)."""
    k = check_positive_int(k, "k", owner)
    search_k = k + 1 if ref_includes_query else k
    if search_k > num_reference:
        most = num_reference - 1 if ref_includes_query else num_reference
        raise InvalidArgumentError(
            f"The 'k' parameter of {owner} must be at most {most} for a reference of "
            f"{num_reference} rows{' that includes the query' if ref_includes_query else ''}. "
            f"Got {k} instead."
        )
    return search_k


def remove_self_matches(
    distances: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop row ``i``'s own index from row ``i``, or its last neighbour if ``i`` is absent.

    Example:
        >>> d = torch.tensor([[0.0, 1.0, 2.0], [0.5, 0.7, 0.9]])
        >>> i = torch.tensor([[0, 4, 5], [3, 4, 6]])
        >>> remove_self_matches(d, i)[1].tolist()
        [[4, 5], [3, 4]]
    """
    num_rows, width = indices.shape
    own = torch.arange(num_rows, device=indices.device).unsqueeze(1)
    drop = indices == own
    drop[:, -1] |= ~drop.any(dim=1)
    keep = ~drop
    return distances[keep].view(num_rows, width - 1), indices[keep].view(num_rows, width - 1)


def _uses_fast_euclidean(distance: BaseDistance) -> bool:
    return (
        isinstance(distance, LpDistance)
        and type(distance).compute_mat is LpDistance.compute_mat
        and distance.p == 2
        and distance.power > 0
    )


def _empty_outputs(
    query: torch.Tensor, ref: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(query.dtype, ref.dtype)
    distances = torch.empty((len(query), k), dtype=dtype, device=query.device)
    indices = torch.empty((len(query), k), dtype=torch.long, device=query.device)
    return distances, indices
