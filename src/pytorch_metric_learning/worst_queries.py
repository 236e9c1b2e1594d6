"""The queries a model fails worst on, with what it retrieved for them.

An average says how often retrieval fails, not how. Looking at the worst queries (their
top-K retrievals, which are right and which wrong, and how far down the nearest right one
is) shows whether the model confuses look-alike classes, is fooled by backgrounds, or
meets mislabelled data. This module finds them from the per-query values of any k-NN
metric of :class:`AccuracyCalculator`; :func:`pytorch_metric_learning.plots.plot_worst_queries`
draws them, and :func:`worst_queries_rows` lays them out as a table for data without images.
The search for the nearest relevant item covers only the chosen queries, so memory stays
linear in the size of the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ._validation import invalid
from .errors import InvalidArgumentError, InvalidTypeError
from .evaluation.retrieval._metric_names import per_query_function
from .evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from .evaluation.search._checked_search import search_knn
from .evaluation.search.registry import Spec

__all__ = ["Retrieval", "WorstQuery", "find_worst_queries", "worst_queries_rows"]

OWNER = "find_worst_queries"
TABLE_HEADER = [
    "query",
    "query label",
    "metric value",
    "rank",
    "reference",
    "label",
    "distance",
    "relevant",
]


@dataclass(frozen=True)
class Retrieval:
    """One retrieved reference item.

    Attributes:
        rank: 1 for the nearest.
        index: Its row in the reference.
        label: Its label.
        distance: What the k-NN backend returned for it (a distance, or a similarity for a
            similarity backend).
        relevant: Whether it shares the query's label.
    """

    rank: int
    index: int
    label: Any
    distance: float
    relevant: bool


@dataclass(frozen=True)
class WorstQuery:
    """A query, its metric value, its top-K retrievals and its nearest relevant item.

    Attributes:
        index: Its row in the query.
        label: Its label.
        value: Its value of the chosen metric.
        retrievals: The first K retrieved items, nearest first.
        nearest_relevant: The nearest relevant reference item (in the top K or not).
    """

    index: int
    label: Any
    value: float
    retrievals: list[Retrieval]
    nearest_relevant: Retrieval

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_worst_queries(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    reference: torch.Tensor | None = None,
    reference_labels: torch.Tensor | None = None,
    *,
    ref_includes_query: bool = False,
    metric: str = "precision_at_1",
    num_queries: int = 10,
    k: int = 5,
    knn_func: Spec | None = None,
) -> list[WorstQuery]:
    """The ``num_queries`` queries with the lowest value of ``metric``, worst first.

    Lone queries (no relevant reference) have no value and are never chosen. Ties keep the
    query order.

    Args:
        query, query_labels, reference, reference_labels, ref_includes_query: As for
            :meth:`AccuracyCalculator.get_accuracy` (1-D labels).
        metric: A k-NN metric with per-query values (``precision_at_1``, ``recall_at_5``,
            ``mean_average_precision_at_r``, ...).
        num_queries: How many queries to return, at most.
        k: Retrievals to show per query.
        knn_func: The k-NN backend spec (default: the calculator's exact search).

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> worst = find_worst_queries(query, labels, num_queries=2, k=1)
        >>> [(w.index, w.retrievals[0].index, w.nearest_relevant.rank) for w in worst]
        [(1, 2, 2), (2, 1, 3)]
    """
    _check_options(metric, num_queries, k, query_labels)
    calculator = AccuracyCalculator(include=(metric,), knn_func=knn_func)
    results = calculator.get_accuracy(
        query,
        query_labels,
        reference,
        reference_labels,
        ref_includes_query,
        return_per_query=True,
    )
    per_query = results["per_query"]
    values = per_query.values[metric].cpu()
    order = torch.sort(values, stable=True).indices[:num_queries]
    rows = per_query.query_indices.cpu()[order]
    self_search = reference is None or ref_includes_query
    reference = query if reference is None else reference
    reference_labels = query_labels if reference_labels is None else reference_labels
    rankings = _rankings(calculator, query[rows.to(query.device)], reference, rows, self_search)
    return [
        _worst_query(int(row), float(value), query_labels, reference_labels, ranking, k)
        for row, value, ranking in zip(rows.tolist(), values[order].tolist(), rankings)
    ]


def _check_options(metric: Any, num_queries: Any, k: Any, query_labels: Any) -> None:
    if not isinstance(metric, str) or per_query_function(metric) is None:
        raise invalid(
            "metric",
            OWNER,
            "a k-NN metric with per-query values, e.g. 'precision_at_1'",
            metric,
        )
    for param, value in (("num_queries", num_queries), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid(param, OWNER, "a positive int", value)
    if isinstance(query_labels, torch.Tensor) and query_labels.ndim != 1:
        raise invalid(
            "query_labels",
            OWNER,
            "1-D labels",
            f"shape {tuple(query_labels.shape)}",
            InvalidTypeError,
        )


def _rankings(
    calculator: AccuracyCalculator,
    chosen: torch.Tensor,
    reference: torch.Tensor,
    rows: torch.Tensor,
    self_search: bool,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every reference item ranked for each chosen query (itself left out in a self-search)."""
    if len(chosen) == 0:
        return []
    chosen = chosen.to(reference.dtype) if chosen.dtype != reference.dtype else chosen
    (distances, indices), _ = search_knn(
        calculator.knn_func, chosen, len(reference), reference, caller=OWNER
    )
    rankings = []
    for row, row_distances, row_indices in zip(rows.tolist(), distances.cpu(), indices.cpu()):
        keep = row_indices != row if self_search else torch.ones_like(row_indices, dtype=torch.bool)
        rankings.append((row_distances[keep], row_indices[keep]))
    return rankings


def _worst_query(
    row: int,
    value: float,
    query_labels: torch.Tensor,
    reference_labels: torch.Tensor,
    ranking: tuple[torch.Tensor, torch.Tensor],
    k: int,
) -> WorstQuery:
    distances, indices = ranking
    labels = reference_labels.cpu()[indices]
    label = query_labels.cpu()[row]
    relevant = labels == label
    first = int(relevant.nonzero()[0]) if bool(relevant.any()) else None
    if first is None:  # cannot happen for a non-lone query, unless the backend is wrong
        raise InvalidArgumentError(f"Query {row} has a value but no relevant reference item.")

    def retrieval(position: int) -> Retrieval:
        return Retrieval(
            position + 1,
            int(indices[position]),
            labels[position].item(),
            float(distances[position]),
            bool(relevant[position]),
        )

    top = [retrieval(position) for position in range(min(k, len(indices)))]
    return WorstQuery(row, label.item(), value, top, retrieval(first))


def worst_queries_rows(worst: Sequence[WorstQuery], k: int | None = None) -> list[list[Any]]:
    """One table row per shown retrieval (:data:`TABLE_HEADER`): the top K of each worst
    query, then its nearest relevant item when it is not among them.

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> worst = find_worst_queries(query, torch.tensor([0, 0, 1, 1]), num_queries=1, k=1)
        >>> worst_queries_rows(worst)
        [[1, 0, 0.0, 1, 2, 1, 1.0, False], [1, 0, 0.0, 2, 0, 0, 4.0, True]]
    """
    rows = []
    for item in worst:
        shown = item.retrievals[:k] if k is not None else item.retrievals
        if item.nearest_relevant.rank > len(shown):
            shown = [*shown, item.nearest_relevant]
        for retrieval in shown:
            rows.append(
                [
                    item.index,
                    item.label,
                    item.value,
                    retrieval.rank,
                    retrieval.index,
                    retrieval.label,
                    retrieval.distance,
                    retrieval.relevant,
                ]
            )
    return rows
