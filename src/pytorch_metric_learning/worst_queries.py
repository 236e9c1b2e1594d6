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

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from ._validation import (
    check_embeddings,
    check_plain_tensor,
    check_positive_int,
    float_if_integer,
    invalid,
)
from .errors import InvalidArgumentError, InvalidTypeError
from .evaluation.retrieval._fingerprint import describe_differences, protocol_record
from .evaluation.retrieval._metric_names import per_query_function
from .evaluation.retrieval._per_query import PerQueryValues
from .evaluation.retrieval._single_shot import single_shot_rank
from .evaluation.retrieval.accuracy_calculator import AccuracyCalculator, CandidateRanking
from .evaluation.search.protocols import knn_is_inverted
from .evaluation.search.registry import Spec

__all__ = [
    "PROTOCOL_ARGUMENTS",
    "Retrieval",
    "VALUE_KINDS",
    "WorstQuery",
    "find_worst_queries",
    "one_draw",
    "single_shot_phrase",
    "worst_queries_header",
    "worst_queries_note",
    "worst_queries_rows",
    "worst_queries_value_kind",
    "worst_queries_value_name",
]

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

# What a worst query's ``value`` is: the metric's own per-query value ("per_query": for
# recall_at_K and precision_at_1 a 0/1 outcome); under single_gallery_shot, for those two,
# the exact expectation over the random single-shot draws ("single_shot_expected") or the
# mean over ``single_gallery_shot_draws`` random draws ("single_shot_drawn"): a chance in
# [0, 1], not an outcome, so a relevant item at rank 1 may still have a value below 1.
VALUE_KINDS = ("per_query", "single_shot_expected", "single_shot_drawn")
SINGLE_SHOT_RANK = "rank (all candidates)"


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
        metric: The metric ``value`` is of, the one the queries were ranked by (``None``
            when unknown, e.g. built by hand): the table and the picture name it.
        k: How many retrievals were asked for per query.
        distance_kind: ``"distance"`` (smaller is nearer) or ``"similarity"`` (larger is
            nearer: a backend with an inverted distance, e.g. cosine similarity), the name
            of the ``distance`` of the retrievals in the table, the JSON and the picture.
        value_kind: What ``value`` is (:data:`VALUE_KINDS`): ``"per_query"``, or under
            ``single_gallery_shot`` (``recall_at_K``, ``precision_at_1``)
            ``"single_shot_expected"`` (the exact expectation over the draws) or
            ``"single_shot_drawn"`` (the mean over ``single_shot_draws`` random draws).
            Then ``retrievals`` and ``nearest_relevant`` rank *every* candidate (the
            ranking the draws choose one item per identity from).
        single_shot_draws: The random draws per query behind a ``"single_shot_drawn"``
            value, else None.
    """

    index: int
    label: Any
    value: float
    retrievals: list[Retrieval]
    nearest_relevant: Retrieval
    metric: str | None = None
    k: int | None = None
    distance_kind: str = "distance"
    value_kind: str = "per_query"
    single_shot_draws: int | None = None

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
    per_query: PerQueryValues | None = None,
    **protocol: Any,
) -> list[WorstQuery]:
    """The ``num_queries`` queries with the lowest value of ``metric``, worst first.

    Lone queries (no relevant reference) have no value and are never chosen. Ties keep the
    query order. Each :class:`WorstQuery` carries ``metric``, ``k`` and ``distance_kind``,
    so what draws or tabulates it names the values rightly.

    The retrievals shown are the query's *candidates* exactly as the metric saw them: under
    a protocol (``query_groups``/``reference_groups``, ``junk_labels``, ``excluded_pairs``,
    ``is_query``/``is_reference``) the references that are not candidates are never shown,
    ranks count candidates only, and a distractor is never relevant. Under
    ``single_gallery_shot`` the value of ``recall_at_K`` and ``precision_at_1`` is the
    single-shot one, a chance in [0, 1] (the exact expectation over the draws, or the mean
    over ``single_gallery_shot_draws`` draws; ``value_kind`` says which), and the ranking
    shown is that of every candidate, which the single-shot draws choose from.

    Args:
        query, query_labels, reference, reference_labels, ref_includes_query: As for
            :meth:`AccuracyCalculator.get_accuracy` (tensors or NumPy arrays; 1-D labels).
        metric: A k-NN metric with per-query values (``precision_at_1``, ``recall_at_5``,
            ``mean_average_precision_at_r``, ...).
        num_queries: How many queries to return, at most.
        k: Retrievals to show per query.
        knn_func: The k-NN backend spec (default: the calculator's exact search).
        per_query: The ``"per_query"`` that ``get_accuracy(..., return_per_query=True)``
            already returned for these inputs and protocol, to rank the queries by instead
            of computing the values again (the search for the rankings shown still runs).
            It must hold ``metric`` and come from a calculator with ``k=None`` and this
            ``knn_func``, as the values this function computes itself do; values
            computed under other arguments (another ``k``, other labels, groups, junk or
            distractor labels, excluded pairs or roles, or another
            ``single_gallery_shot``/``single_gallery_shot_draws``) are refused with an
            ``InvalidArgumentError`` naming ``per_query`` and what differs (each
            ``PerQueryValues`` records what it was computed under:
            ``computed_under``). ``pml-eval evaluate --show-worst`` passes it so that the
            metrics are computed (and warn) once.
        **protocol: The protocol arguments of :meth:`AccuracyCalculator.get_accuracy`
            (``query_groups``, ``reference_groups``, ``junk_labels``,
            ``distractor_labels``, ``excluded_pairs``, ``is_query``, ``is_reference``,
            ``single_gallery_shot``, ``single_gallery_shot_draws``). Under ``is_query``,
            query and reference indices are rows of the one set.

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> worst = find_worst_queries(query, labels, num_queries=2, k=1)
        >>> [(w.index, w.retrievals[0].index, w.nearest_relevant.rank) for w in worst]
        [(1, 2, 2), (2, 1, 3)]
    """
    num_queries, k = _check_options(metric, num_queries, k)
    _check_protocol_names(protocol)
    query = _embeddings(query, "query")
    query_labels = _labels(query_labels, "query_labels", query)
    if reference is not None:
        reference = _embeddings(reference, "reference")
    if reference_labels is not None:
        reference_labels = _labels(reference_labels, "reference_labels", reference)
    calculator = AccuracyCalculator(include=(metric,), knn_func=knn_func)
    inputs = (query, query_labels, reference, reference_labels, ref_includes_query)
    if per_query is None:
        with _named_as_ours():
            results = calculator.get_accuracy(*inputs, return_per_query=True, **protocol)
        per_query = results["per_query"]
    values = _given_values(per_query, metric, len(query)).cpu()
    _check_computed_under(per_query, protocol_record(calculator.k, inputs, protocol))
    order = torch.sort(values, stable=True).indices[:num_queries]
    rows = per_query.query_indices.cpu()[order]
    rankings = []
    if len(rows):
        # the same inputs: get_accuracy has warned already
        with warnings.catch_warnings(), _named_as_ours():
            warnings.simplefilter("ignore")
            rankings = calculator.rank_candidates(rows, *inputs, **protocol)
    all_labels = query_labels if reference_labels is None else reference_labels
    kind = _distance_kind(calculator.knn_func)
    value_kind, draws = _value_kind(metric, protocol)
    return [
        replace(
            _worst_query(float(value), query_labels, all_labels, ranking, k),
            metric=metric,
            k=k,
            distance_kind=kind,
            value_kind=value_kind,
            single_shot_draws=draws,
        )
        for value, ranking in zip(values[order].tolist(), rankings)
    ]


@contextlib.contextmanager
def _named_as_ours() -> Iterator[None]:
    """Refusals of the calculator's checks name find_worst_queries (the arguments were
    ours)."""
    try:
        yield
    except (InvalidArgumentError, InvalidTypeError) as error:
        error.args = (str(error).replace("AccuracyCalculator.get_accuracy", OWNER),)
        raise


def _given_values(per_query: Any, metric: str, num_query: int) -> torch.Tensor:
    """``per_query.values[metric]``, checked: a :class:`PerQueryValues` holding ``metric``
    for query indices of this query."""
    if not isinstance(per_query, PerQueryValues):
        raise invalid(
            "per_query",
            OWNER,
            "None or the PerQueryValues of get_accuracy(..., return_per_query=True)",
            type(per_query).__name__,
            InvalidTypeError,
        )
    if metric not in per_query.values:
        raise invalid(
            "per_query",
            OWNER,
            f"per-query values of the metric {metric!r}",
            f"values of {sorted(per_query.values)}",
        )
    values, indices = per_query.values[metric], per_query.query_indices
    last = int(indices.max()) if len(indices) else -1
    if len(values) != len(indices) or last >= num_query:
        raise invalid(
            "per_query",
            OWNER,
            f"one value per query index, indices below the {num_query} queries",
            f"{len(values)} values for {len(indices)} query indices up to {last}",
        )
    return values


def _check_computed_under(per_query: PerQueryValues, ours: dict[str, str]) -> None:
    """Refuse values computed under other arguments than this call's: they would rank and
    label the queries as what they are not (plain outcomes as single-shot expectations,
    values without the camera rule as values with it, ...)."""
    there = per_query.computed_under
    if there is None:
        raise invalid(
            "per_query",
            OWNER,
            "the PerQueryValues of get_accuracy(..., return_per_query=True), which records "
            "the arguments it was computed under",
            "PerQueryValues that record none (built by hand?)",
        )
    differences = describe_differences(there, ours)
    if differences:
        raise InvalidArgumentError(
            f"The 'per_query' parameter of {OWNER} must hold values computed under this "
            "call's own arguments (a calculator with k=None, the same inputs and protocol). "
            f"Got values computed under other ones: {differences}. Leave 'per_query' out "
            "to compute the values for these arguments, or pass the same arguments as the "
            "get_accuracy call."
        )


def _value_kind(metric: str, protocol: dict[str, Any]) -> tuple[str, int | None]:
    """What the values of ``metric`` are under ``protocol`` (checked by get_accuracy)."""
    if not protocol.get("single_gallery_shot") or single_shot_rank(metric) is None:
        return "per_query", None
    draws = protocol.get("single_gallery_shot_draws")
    return ("single_shot_expected", None) if draws is None else ("single_shot_drawn", int(draws))


# The keyword arguments of get_accuracy that change which references are candidates.
PROTOCOL_ARGUMENTS = (
    "query_groups",
    "reference_groups",
    "junk_labels",
    "distractor_labels",
    "excluded_pairs",
    "is_query",
    "is_reference",
    "single_gallery_shot",
    "single_gallery_shot_draws",
)


def _check_protocol_names(protocol: dict[str, Any]) -> None:
    unknown = sorted(set(protocol) - set(PROTOCOL_ARGUMENTS))
    if unknown:
        raise TypeError(f"{OWNER}() got unexpected keyword arguments {unknown}")


def _embeddings(value: Any, param: str) -> torch.Tensor:
    """Embeddings as :meth:`AccuracyCalculator.get_accuracy` takes them (tensor or array)."""
    tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    tensor = check_plain_tensor(tensor, param, OWNER)
    if isinstance(tensor, torch.Tensor):
        tensor = float_if_integer(tensor)
    return check_embeddings(tensor, param, OWNER)


def _labels(value: Any, param: str, embeddings: torch.Tensor | None) -> torch.Tensor:
    """1-D labels, one per embedding row, as a tensor (NumPy arrays are converted)."""
    if isinstance(value, np.ndarray):
        try:
            value = torch.from_numpy(value)
        except TypeError:
            raise invalid(param, OWNER, "numeric labels", value.dtype, InvalidTypeError) from None
    if not isinstance(value, torch.Tensor):
        raise invalid(param, OWNER, "a torch.Tensor", type(value).__name__, InvalidTypeError)
    value = check_plain_tensor(value, param, OWNER)
    if value.ndim != 1:
        raise invalid(param, OWNER, "1-D labels", f"shape {tuple(value.shape)}", InvalidTypeError)
    if embeddings is not None and len(value) != len(embeddings):
        raise invalid(param, OWNER, f"{len(embeddings)} labels (one per row)", len(value))
    return value


def _distance_kind(knn_func: Any) -> str:
    """``"similarity"`` for a backend that returns similarities (larger is nearer), by the
    rule every reader of its output follows (:func:`knn_is_inverted`), else ``"distance"``."""
    return "similarity" if knn_is_inverted(knn_func) else "distance"


def _check_options(metric: Any, num_queries: Any, k: Any) -> tuple[int, int]:
    """``(num_queries, k)`` as ints, checked by the library's one integer check (NumPy
    integers pass, as everywhere else; bools, floats and tensors do not)."""
    if not isinstance(metric, str) or per_query_function(metric) is None:
        raise invalid(
            "metric",
            OWNER,
            "a k-NN metric with per-query values, e.g. 'precision_at_1'",
            metric,
        )
    return check_positive_int(num_queries, "num_queries", OWNER), check_positive_int(k, "k", OWNER)


def _worst_query(
    value: float,
    query_labels: torch.Tensor,
    reference_labels: torch.Tensor,
    ranking: CandidateRanking,
    k: int,
) -> WorstQuery:
    """One worst query from its ranked candidates (relevance as the metric counted it)."""
    row, distances, indices, relevant = (
        ranking.query,
        ranking.distances,
        ranking.indices,
        ranking.relevant,
    )
    labels = reference_labels.cpu()[indices]
    label = query_labels.cpu()[row]
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


def worst_queries_header(worst: Sequence[WorstQuery]) -> list[str]:
    """:data:`TABLE_HEADER` named for these queries: the metric's name for ``"metric
    value"`` (with what the values are under single-gallery-shot, see
    :func:`worst_queries_value_name`), the kind of the distances (``"distance"`` or
    ``"similarity"``) for ``"distance"``, and under single-gallery-shot ``"rank (all
    candidates)"`` for ``"rank"`` (the ranking the draws choose from, not a drawn one).

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> worst = find_worst_queries(query, torch.tensor([0, 0, 1, 1]), num_queries=1, k=1)
        >>> worst_queries_header(worst)[2:]
        ['precision_at_1', 'rank', 'reference', 'label', 'distance', 'relevant']
        >>> single = find_worst_queries(
        ...     query, torch.tensor([0, 0, 1, 1]), num_queries=1, k=1, single_gallery_shot=True)
        >>> worst_queries_header(single)[2:4]
        ['precision_at_1 (expected over single-shot draws)', 'rank (all candidates)']
    """
    kinds = {item.distance_kind for item in worst}
    kind = kinds.pop() if len(kinds) == 1 else "distance"
    single_shot = worst_queries_value_kind(worst)[0] != "per_query"
    names = {
        "metric value": worst_queries_value_name(worst),
        "distance": kind,
        "rank": SINGLE_SHOT_RANK if single_shot else "rank",
    }
    return [names.get(name, name) for name in TABLE_HEADER]


def worst_queries_value_kind(
    worst: Sequence[WorstQuery], owner: str = OWNER
) -> tuple[str, int | None]:
    """``(value_kind, single_shot_draws)`` the queries share (:data:`VALUE_KINDS`).

    Raises:
        InvalidArgumentError: the queries carry values of different kinds.
    """
    kinds = {(item.value_kind, item.single_shot_draws) for item in worst}
    if len(kinds) > 1:
        raise InvalidArgumentError(
            f"The 'worst' parameter of {owner} mixes queries whose values are of different "
            f"kinds ({sorted(kinds, key=str)}); draw or tabulate one ranking at a time."
        )
    return kinds.pop() if kinds else ("per_query", None)


def worst_queries_value_name(worst: Sequence[WorstQuery], metric: str | None = None) -> str:
    """The name of the queries' values: their metric, and under single-gallery-shot what
    the values are (``"recall_at_1 (expected over single-shot draws)"``, or ``"... (mean
    of 10 single-shot draws)"`` with ``single_gallery_shot_draws=10``).

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> worst_queries_value_name(find_worst_queries(query, labels, num_queries=1))
        'precision_at_1'
        >>> drawn = find_worst_queries(
        ...     query, labels, num_queries=1, single_gallery_shot=True, single_gallery_shot_draws=10)
        >>> worst_queries_value_name(drawn)
        'precision_at_1 (mean of 10 single-shot draws)'
    """
    name = queries_metric(worst, metric) or "metric value"
    kind, draws = worst_queries_value_kind(worst)
    what = single_shot_phrase(kind, draws)
    return name if what is None else f"{name} ({what})"


def single_shot_phrase(kind: str, draws: int | None) -> str | None:
    """What values of ``kind`` (:data:`VALUE_KINDS`) are, for a column or a title: None
    for plain per-query values; one draw is named in the singular (its values are 0/1).

    Example:
        >>> [single_shot_phrase("single_shot_drawn", n) for n in (1, 3)]
        ['one single-shot draw', 'mean of 3 single-shot draws']
    """
    if kind == "single_shot_expected":
        return "expected over single-shot draws"
    if kind == "single_shot_drawn":
        return "one single-shot draw" if draws == 1 else f"mean of {draws} single-shot draws"
    return None


def one_draw(kind: str, draws: int | None) -> bool:
    """Whether values of ``kind`` come from a single single-shot draw: 0/1 outcomes."""
    return kind == "single_shot_drawn" and draws == 1


def worst_queries_note(worst: Sequence[WorstQuery]) -> str | None:
    """What a reader of the single-gallery-shot table (or picture) can check, or None for
    plain values.

    Example:
        >>> query = torch.tensor([[0.0], [2.0], [3.0], [8.0]])
        >>> worst_queries_note(find_worst_queries(query, torch.tensor([0, 0, 1, 1])))
    """
    kind, draws = worst_queries_value_kind(worst)
    if kind == "per_query":
        return None
    if one_draw(kind, draws):
        return (
            "Single gallery shot: each value is the 0/1 outcome of one random draw of one "
            "candidate per identity; ranks and relevance are those of every candidate, "
            "before the draw (a relevant item at rank 1 can still score 0 when its "
            "identity's drawn item is a farther one)."
        )
    value = (
        "the exact expectation over the random draws"
        if kind == "single_shot_expected"
        else f"the mean over {draws} random draws"
    )
    return (
        f"Single gallery shot: each value is {value} of one candidate per identity, a "
        "number in [0, 1], not a 0/1 outcome; ranks and relevance are those of every "
        "candidate, before any draw (a relevant item at rank 1 can still lose rank 1 "
        "when its identity's drawn item is a farther one)."
    )


def queries_metric(
    worst: Sequence[WorstQuery], metric: str | None, owner: str = OWNER
) -> str | None:
    """The metric the queries were ranked by; ``metric`` when given must agree with it.

    Raises:
        InvalidArgumentError: ``metric`` names another metric than the queries carry, or
            the queries carry different metrics.
    """
    carried = {item.metric for item in worst if item.metric is not None}
    if len(carried) > 1:
        raise InvalidArgumentError(
            f"The 'worst' parameter of {owner} mixes queries ranked by different metrics "
            f"({', '.join(sorted(carried))}); draw or tabulate one ranking at a time."
        )
    if metric is not None and carried and metric not in carried:
        raise InvalidArgumentError(
            f"The 'metric' parameter of {owner} is {metric!r}, but the queries were ranked "
            f"by {next(iter(carried))!r} (their values are of that metric). Leave 'metric' "
            "out: the queries name it."
        )
    return metric if metric is not None else (carried.pop() if carried else None)


def worst_queries_rows(worst: Sequence[WorstQuery], k: int | None = None) -> list[list[Any]]:
    """One table row per shown retrieval (:data:`TABLE_HEADER`, named for these queries by
    :func:`worst_queries_header`): the top K of each worst query, then its nearest relevant
    item when it is not among them.

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
