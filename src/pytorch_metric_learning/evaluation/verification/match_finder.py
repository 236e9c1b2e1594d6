"""Match/no-match decisions between embeddings at a fixed threshold."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..._validation import check_embeddings, invalid
from ...distances import BaseDistance
from ...errors import InvalidArgumentError, InvalidTypeError

__all__ = ["MatchFinder"]

# Values per block of the distance matrix: rows are processed so that one block of
# distances (and its boolean decisions) is at most this many elements.
_BLOCK_ELEMENTS = 2**22


class MatchFinder:
    """Decide which pairs of embeddings match at a threshold.

    A pair matches when its distance is at most ``threshold``, or, for a distance with
    ``is_inverted=True`` (a similarity), when its similarity is at least ``threshold``.
    Computations run under ``torch.no_grad()`` on the inputs' device.

    Args:
        distance: The distance or similarity; its normalization and power are honoured.
            ``None`` is accepted, as in 2.x, for a distance assigned later
            (``finder.distance = ...``); a method called while it is None raises
            ``InvalidArgumentError``.
        threshold: The default threshold; a threshold passed to a method overrides it.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.distances import CosineSimilarity
        >>> finder = MatchFinder(CosineSimilarity(), threshold=0.9)
        >>> finder.is_match(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.1]])).tolist()
        [True]
    """

    distance: BaseDistance | None

    def __init__(self, distance: BaseDistance | None, threshold: float | None = None) -> None:
        if distance is not None and not isinstance(distance, BaseDistance):
            raise invalid(
                "distance", "MatchFinder", "a BaseDistance or None", distance, InvalidTypeError
            )
        self.distance = distance
        self.threshold = None if threshold is None else _check_threshold(threshold, "MatchFinder")

    def __repr__(self) -> str:
        return f"MatchFinder({self.distance!r}, threshold={self.threshold!r})"

    @torch.no_grad()
    def get_match_matrix(
        self,
        query_emb: torch.Tensor,
        ref_emb: torch.Tensor | None = None,
        threshold: float | None = None,
    ) -> torch.Tensor:
        """Return the boolean ``(len(query_emb), len(ref_emb))`` matrix of matches.

        ``ref_emb=None`` compares ``query_emb`` with itself. The distance matrix is
        computed in blocks of rows, so memory beyond the output stays bounded.

        Example:
            >>> from pytorch_metric_learning.distances import LpDistance
            >>> finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
            >>> finder.get_match_matrix(torch.tensor([[0.0], [3.0]])).tolist()
            [[True, False], [False, True]]
        """
        threshold = self._resolve_threshold(threshold, "get_match_matrix")
        query, ref, out_dtype = self._prepare(query_emb, ref_emb, "get_match_matrix")
        matches = torch.empty((len(query), len(ref)), dtype=torch.bool, device=query.device)
        for start, block in self._blocks(query, ref, out_dtype):
            matches[start : start + len(block)] = self._decide(block, threshold)
        return matches

    @torch.no_grad()
    def get_match_indices(
        self,
        query_emb: torch.Tensor,
        ref_emb: torch.Tensor | None = None,
        threshold: float | None = None,
    ) -> torch.Tensor:
        """Return the ``(num_matches, 2)`` long tensor of (query, reference) index pairs.

        Rows are in row-major order of the match matrix, which is never held at once:
        each block of rows contributes its own matches.

        Example:
            >>> from pytorch_metric_learning.distances import LpDistance
            >>> finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
            >>> finder.get_match_indices(torch.tensor([[0.0], [3.0]])).tolist()
            [[0, 0], [1, 1]]
        """
        threshold = self._resolve_threshold(threshold, "get_match_indices")
        query, ref, out_dtype = self._prepare(query_emb, ref_emb, "get_match_indices")
        found = [torch.empty((0, 2), dtype=torch.long, device=query.device)]
        for start, block in self._blocks(query, ref, out_dtype):
            indices = torch.nonzero(self._decide(block, threshold))
            indices[:, 0] += start
            found.append(indices)
        return torch.cat(found)

    @torch.no_grad()
    def is_match(
        self, x: torch.Tensor, y: torch.Tensor, threshold: float | None = None
    ) -> torch.Tensor:
        """Return whether row ``i`` of ``x`` matches row ``i`` of ``y``, shaped ``(len(x),)``.

        Only corresponding pairs are computed, with ``distance.pairwise``.

        Example:
            >>> from pytorch_metric_learning.distances import LpDistance
            >>> finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
            >>> finder.is_match(torch.tensor([[0.0], [0.0]]), torch.tensor([[0.5], [2.0]])).tolist()
            [True, False]
        """
        threshold = self._resolve_threshold(threshold, "is_match")
        owner = "MatchFinder.is_match"
        check_embeddings(x, "x", owner)
        check_embeddings(y, "y", owner)
        return self._decide(self._distance("is_match").pairwise(x, y), threshold)

    def get_matching_pairs(
        self,
        query_emb: torch.Tensor,
        ref_emb: torch.Tensor | None = None,
        threshold: float | None = None,
        return_tuples: bool = False,
    ) -> np.ndarray | list[tuple[Any, Any]]:
        """Deprecated: the pytorch-metric-learning 2.x name, with its NumPy return values.

        Returns the match matrix as a NumPy boolean array or, with ``return_tuples``, a
        list of ``(query index, reference index)`` tuples. Use :meth:`get_match_matrix`
        or :meth:`get_match_indices` instead, which return tensors on the inputs' device.
        """
        warnings.warn(
            "MatchFinder.get_matching_pairs is deprecated; use get_match_matrix for a "
            "boolean tensor or get_match_indices for a (num_matches, 2) tensor of pairs.",
            DeprecationWarning,
            stacklevel=2,
        )
        if return_tuples:
            indices = self.get_match_indices(query_emb, ref_emb, threshold).cpu().numpy()
            return list(zip(indices[:, 0], indices[:, 1]))
        return self.get_match_matrix(query_emb, ref_emb, threshold).cpu().numpy()

    def _resolve_threshold(self, threshold: float | None, method: str) -> float:
        if threshold is not None:
            return _check_threshold(threshold, f"MatchFinder.{method}")
        if self.threshold is None:
            raise InvalidArgumentError(
                f"MatchFinder.{method} needs a threshold: pass threshold= to the method or "
                "to MatchFinder(distance, threshold=...). Got None for both instead."
            )
        return self.threshold

    def _prepare(
        self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None, method: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
        owner = f"MatchFinder.{method}"
        check_embeddings(query_emb, "query_emb", owner)
        if ref_emb is not None:
            check_embeddings(ref_emb, "ref_emb", owner)
        return self._distance(method).prepare(query_emb, ref_emb)

    def _blocks(
        self, query: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(first row, distances of a block of query rows to every reference row)``."""
        distance = self._distance("get_match_matrix")
        rows = max(1, _BLOCK_ELEMENTS // max(len(ref), 1))
        for start in range(0, len(query), rows):
            values = distance.compute_mat(query[start : start + rows], ref)
            yield start, distance.finish(values, out_dtype)

    def _decide(self, values: torch.Tensor, threshold: float) -> torch.Tensor:
        inverted = self._distance("is_match").is_inverted
        return values >= threshold if inverted else values <= threshold

    def _distance(self, method: str) -> BaseDistance:
        """The distance, checked: 2.x code may construct with None and assign it later."""
        distance = self.distance
        if not isinstance(distance, BaseDistance):
            raise invalid(
                "distance",
                f"MatchFinder.{method}",
                "a BaseDistance (set finder.distance or pass it to MatchFinder)",
                distance,
                InvalidTypeError if distance is not None else InvalidArgumentError,
            )
        return distance


def _check_threshold(threshold: Any, owner: str) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise invalid("threshold", owner, "a real number", threshold, InvalidTypeError)
    if math.isnan(threshold):
        raise invalid("threshold", owner, "a real number, not NaN", threshold)
    return float(threshold)
