"""A k-NN search that honours an :class:`Exclusion`, with any backend.

A backend that takes an ``exclusion`` keyword (``CustomKNN`` does) leaves the excluded
pairs out inside its tiles. Any other backend cannot: it is asked for more neighbours
than needed (``k`` plus the most pairs any query excludes, plus the references that are
never candidates), its answer is filtered, and the width doubles until every query has
``k`` candidates or the whole reference was searched. The answer is exact whenever the
backend is: the first ``k`` candidates of a row of ``k + e`` neighbours, ``e`` of them
excluded at most, are its first ``k`` candidates.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from ._checked_search import search_knn
from .exclusion import Exclusion
from .knn_output import check_knn_output

__all__ = ["accepts_exclusion", "search_excluding"]

logger = logging.getLogger(__name__)


def accepts_exclusion(knn_func: Any) -> bool:
    """Whether ``knn_func`` takes an ``exclusion`` keyword (applies it in its search)."""
    try:
        parameters = inspect.signature(knn_func).parameters
    except (TypeError, ValueError):
        return False
    return "exclusion" in parameters


def search_excluding(
    knn_func: Any,
    query: torch.Tensor,
    k: int,
    reference: torch.Tensor,
    exclusion: Exclusion,
    caller: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(distances, indices, valid)``, each ``(len(query), k)``: every row's candidates
    first, nearest first; ``valid`` is False on the columns past a row's last candidate
    (rows with fewer than ``k`` candidates), whose entries mean nothing. References that
    are never candidates are dropped before the backend is called.

    Example:
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> from pytorch_metric_learning.evaluation.search import CustomKNN
        >>> knn = CustomKNN(LpDistance(normalize_embeddings=False))
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> rule = Exclusion(1, 3, pairs=torch.tensor([[0, 0]]))
        >>> search_excluding(knn, x[:1], 2, x, rule)[1].tolist()
        [[1, 2]]
    """
    rules, kept = exclusion.candidates_only()
    searched = reference if kept is None else reference[kept.to(reference.device)]
    width = min(k, len(searched))
    if width == 0:
        distances = torch.empty((len(query), 0), dtype=query.dtype, device=query.device)
        indices = torch.empty((len(query), 0), dtype=torch.long, device=query.device)
    elif accepts_exclusion(knn_func):
        output = knn_func(query, width, searched, False, exclusion=rules)
        distances, indices = check_knn_output(
            output, query, width, searched, False, backend=knn_func, caller=caller
        )
    else:
        distances, indices = _search_wider(knn_func, query, width, searched, rules, caller)
    distances, indices, valid = _candidates_first(distances, indices, rules, width)
    if kept is not None:
        indices = kept.to(indices.device)[indices]
    return _padded(distances, indices, valid, k)


def _padded(
    distances: torch.Tensor, indices: torch.Tensor, valid: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``k`` columns: those missing (more than the candidates were asked for) are invalid."""
    missing = k - indices.shape[1]
    if missing <= 0:
        return distances, indices, valid
    rows = len(indices)
    pad = torch.zeros((rows, missing), dtype=torch.long, device=indices.device)
    return (
        torch.cat(
            [
                distances,
                torch.full(
                    (rows, missing), torch.inf, dtype=distances.dtype, device=distances.device
                ),
            ],
            dim=1,
        ),
        torch.cat([indices, pad], dim=1),
        torch.cat([valid, pad.bool()], dim=1),
    )


def _search_wider(
    knn_func: Any,
    query: torch.Tensor,
    k: int,
    reference: torch.Tensor,
    exclusion: Exclusion,
    caller: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neighbours of a backend that cannot exclude, enough for ``k`` candidates per row."""
    width = min(len(reference), k + _most_excluded(exclusion))
    while True:
        (distances, indices), _ = search_knn(
            knn_func, query, width, reference, False, caller=caller
        )
        candidates = (~exclusion.excluded_at(indices)).sum(dim=1)
        if width == len(reference) or bool((candidates >= k).all()):
            return distances, indices
        logger.info("A query has fewer than k=%d candidates among %d neighbours", k, width)
        width = min(len(reference), 2 * width)


def _most_excluded(exclusion: Exclusion) -> int:
    """The most references one query can lose to the rules (an upper bound)."""
    never = exclusion.never_candidates
    most_pairs = 0
    for rows, _ in exclusion.distinct_pairs():
        if len(rows):
            most_pairs = max(most_pairs, int(torch.bincount(rows - int(rows.min())).max()))
    return most_pairs + (0 if never is None else int(never.sum()))


def _candidates_first(
    distances: torch.Tensor, indices: torch.Tensor, exclusion: Exclusion, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each row's excluded entries after its candidates (keeping their order) and
    keep ``k`` columns."""
    valid = ~exclusion.excluded_at(indices)
    order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)[:, :k]
    return distances.gather(1, order), indices.gather(1, order), valid.gather(1, order)
