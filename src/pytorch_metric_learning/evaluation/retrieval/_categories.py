"""Per-category breakdown: every metric on the queries of each category alone.

Benchmarks such as Stanford Online Products group their classes into super-categories
(bicycle, chair, ...), and one average hides that a model fails on a category. A query's
k-NN metric depends only on its own neighbours, so the breakdown reuses the one search of
the whole query: each category takes the rows of the k-NN outputs and of the label
statistics that belong to its queries, with its classes renumbered as if they were the only
ones. Clustering metrics are recomputed on the category's queries. The result equals
``get_accuracy`` called on each category's queries alone, against the same reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..._validation import check_plain_tensor, invalid
from ...errors import InvalidTypeError
from ._label_stats import LabelStats

__all__ = ["Categories", "check_categories", "category_kwargs"]

OWNER = "AccuracyCalculator.get_accuracy"
# k-NN outputs with one row per query, sliced with the query.
_ROW_KEYS = (
    "knn_labels",
    "knn_distances",
    "knn_indices",
    "relevance",
    "not_lone_query_mask",
    "single_shot_cmc",
    "knn_values",  # the per-query values of a computation block by block of queries
)


class Categories:
    """Each query's category as an id, and the category names in sorted order.

    Attributes:
        ids: Long tensor, one id per query, indexing ``names``.
        names: The distinct categories (ints or strings), sorted.
    """

    def __init__(self, ids: torch.Tensor, names: list[Any]) -> None:
        self.ids = ids
        self.names = names

    def masks(self) -> list[tuple[Any, torch.Tensor]]:
        """``(name, boolean mask of its queries)`` for each category, in sorted order."""
        return [(name, self.ids == i) for i, name in enumerate(self.names)]


def check_categories(value: Any, num_queries: int, device: torch.device) -> Categories:
    """Validate ``query_categories``: a 1-D integer tensor or array, or a sequence of ints
    or strings, with one entry per query.

    Example:
        >>> found = check_categories(["chair", "bike", "chair"], 3, torch.device("cpu"))
        >>> found.names, found.ids.tolist()
        (['bike', 'chair'], [1, 0, 1])
    """
    expected = (
        f"a 1-D integer tensor or a sequence of ints or strings, one per query ({num_queries})"
    )
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        check_plain_tensor(value, "query_categories", OWNER)
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise invalid("query_categories", OWNER, expected, value.dtype, InvalidTypeError)
        if value.ndim != 1:
            raise invalid("query_categories", OWNER, expected, f"shape {tuple(value.shape)}")
        items: list[Any] = value.tolist()
    elif isinstance(value, (list, tuple, np.ndarray)) and not isinstance(value, (str, bytes)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        # NumPy scalars (np.int64, np.str_) become plain ints and strings: the result's keys
        # then print, compare and serialise like the categories the user wrote.
        items = [item.item() if isinstance(item, np.generic) else item for item in items]
        kinds = {_kind(item) for item in items}
        if None in kinds or len(kinds) > 1:
            raise invalid("query_categories", OWNER, expected, _first_odd(items), InvalidTypeError)
    else:
        raise invalid("query_categories", OWNER, expected, type(value).__name__, InvalidTypeError)
    if len(items) != num_queries:
        raise invalid("query_categories", OWNER, expected, f"{len(items)} entries")
    names = sorted(set(items))
    index = {name: i for i, name in enumerate(names)}
    ids = torch.tensor([index[item] for item in items], dtype=torch.long, device=device)
    return Categories(ids, names)


def _kind(item: Any) -> type | None:
    if isinstance(item, str):
        return str
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        return int
    return None


def _first_odd(items: Sequence[Any]) -> Any:
    """The first entry that is neither an int nor a string, or the mixed sequence."""
    odd = [item for item in items if _kind(item) is None]
    return odd[0] if odd else "a mix of ints and strings"


def category_kwargs(kwargs: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
    """``get_accuracy``'s computed keyword arguments restricted to the queries in ``mask``,
    as if those queries had been evaluated alone against the same reference."""
    rows = mask.nonzero().flatten()
    sliced = dict(kwargs)
    sliced["query"] = kwargs["query"][rows]
    sliced["query_labels"] = kwargs["query_labels"][rows]
    sliced.pop("cluster_labels", None)
    for key in _ROW_KEYS:
        if kwargs.get(key) is not None:
            sliced[key] = kwargs[key][rows]
    stats = kwargs.get("label_stats")
    if stats is not None:
        sub = subset_stats(stats, rows)
        sliced["label_stats"] = sub
        sliced["label_counts"] = (sub.unique_query_labels, sub.match_counts)
        sliced["lone_query_labels"] = sub.unique_query_labels[
            torch.unique(sub.query_class[~sub.not_lone])
        ]
    return sliced


def subset_stats(stats: LabelStats, rows: torch.Tensor) -> LabelStats:
    """The label statistics of the queries at ``rows``, their classes renumbered in label
    order over the classes those queries have (as :func:`label_stats` would on them)."""
    classes, query_class = torch.unique(stats.query_class[rows], sorted=True, return_inverse=True)
    return LabelStats(
        unique_query_labels=stats.unique_query_labels[classes],
        query_class=query_class,
        match_counts=stats.match_counts[classes],
        num_relevant=stats.num_relevant[rows],
        query_keys=None if stats.query_keys is None else stats.query_keys[rows],
        reference_keys=stats.reference_keys,
    )
