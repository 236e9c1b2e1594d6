"""AccuracyCalculator: retrieval and clustering metrics of query and reference embeddings.

The calculator asks its k-NN backend once, under ``torch.no_grad()``, for exactly the
number of neighbours its selected metrics need, validates the answer, and computes every
metric from one boolean relevance matrix on the input device. Label statistics are
vectorized; nothing is quadratic in memory unless ``k=None`` asks for every neighbour of
a metric that uses them all (``mean_average_precision``, ``mean_reciprocal_rank``).

Code written for pytorch-metric-learning 2.x keeps working: subclasses that add
``calculate_<name>`` methods and extend :meth:`AccuracyCalculator.requires_knn` or
:meth:`AccuracyCalculator.requires_clustering` get their metric computed, with the
keyword arguments 2.x passed (``knn_labels``, ``query_labels``, ``not_lone_query_mask``,
``label_counts``, ``cluster_labels``, ...).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..._metric_catalog import DEFAULT_METRICS, ON_REQUEST_METRICS
from ..._threads import adapted_threads
from ..._validation import check_embeddings, check_same_device, float_if_integer, invalid
from ..._warnings import warn_external
from ...distances import LpDistance
from ...errors import InvalidArgumentError, InvalidTypeError
from ..clustering.kmeans import TorchKMeans
from ..clustering.mutual_information import adjusted_mutual_info, normalized_mutual_info
from ..search._checked_search import search_knn
from ..search._excluded_search import search_excluding
from ..search._spot_check import SpotCheck
from ..search.exclusion import Exclusion
from ..search.knn import CustomKNN
from ..search.registry import Spec, load_kmeans_func, load_knn_func
from . import metrics
from ._blocked import KNN_OUTPUT_BUDGET, Blocks, blocked_values, output_bytes
from ._calculator_checks import (
    check_device,
    check_has_columns,
    check_has_rows,
    check_labels_not_nan,
    check_plain_tensor,
)
from ._categories import Categories, category_kwargs, check_categories
from ._compat import EQUALITY, legacy_knn_metric
from ._fingerprint import protocol_record
from ._label_stats import LabelComparison, LabelStats, label_stats, relevance_of
from ._metric_names import describe_families, parse_metric_name, per_query_function
from ._per_query import PerQueryValues, collect_per_query, per_query_values
from ._protocol import (
    Protocol,
    ProtocolOptions,
    Roles,
    build_protocol,
    check_groups,
    check_no_overlap,
    check_pairs,
    protocol_relevance,
    protocol_stats,
    split_roles,
)
from ._single_shot import (
    SingleShot,
    drawn_cmc,
    expected_cmc,
    single_shot_option,
    single_shot_rank,
)

__all__ = [
    "AccuracyCalculator",
    "CandidateRanking",
    "EQUALITY",
    "DEFAULT_METRICS",
    "ON_REQUEST_METRICS",
]

OWNER = "AccuracyCalculator"
logger = logging.getLogger(__name__)
_R_METRICS = frozenset({"r_precision", "mean_average_precision_at_r"})
_ONE_NEIGHBOUR_METRICS = frozenset({"precision_at_1"})
# Relevance elements processed at once by a metric (bounds float64 temporaries).
_METRIC_BLOCK = 1 << 22

MetricValue = Any  # a float, or a list of floats with return_per_class


@dataclass(frozen=True)
class _Call:
    """The checked inputs of one call: ``tensors`` are ``(query, query_labels, reference,
    reference_labels)`` (each role's rows of one set under ``roles``); ``options`` is None
    without a protocol."""

    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    ref_includes_query: bool
    options: ProtocolOptions | None = None
    self_rows: torch.Tensor | None = None
    single_shot: SingleShot | None = None
    roles: Roles | None = None


@dataclass(frozen=True)
class CandidateRanking:
    """One query's candidates, nearest first (see :meth:`AccuracyCalculator.rank_candidates`).

    Attributes:
        query: The query's row (under ``is_query``/``is_reference``: its row in the set).
        distances: What the k-NN backend returned for each candidate.
        indices: Each candidate's reference row (under the roles: its row in the set).
        relevant: Whether each candidate is relevant (the query's label, not a distractor).
    """

    query: int
    distances: torch.Tensor
    indices: torch.Tensor
    relevant: torch.Tensor


class _UnsupportedCombinationError(InvalidArgumentError, NotImplementedError):
    """Options that cannot be used together (a ValueError; NotImplementedError as in 2.x)."""


def _named_method(method: Callable[..., MetricValue], name: str) -> Callable[..., MetricValue]:
    method.__name__ = method.__qualname__ = f"calculate_{name}"
    method.__doc__ = f"The built-in ``{name}``, with the keyword arguments 2.x passed."
    return method


def _legacy_arguments(
    knn_labels: Any, query_labels: Any, not_lone_query_mask: Any, label_counts: Any
) -> dict[str, Any]:
    return {
        "knn_labels": knn_labels,
        "query_labels": query_labels,
        "not_lone_query_mask": not_lone_query_mask,
        "label_counts": label_counts,
    }


def _knn_metric_method(name: str) -> Callable[..., MetricValue]:
    """A built-in k-NN metric method with 2.x's signature (no source flag)."""

    def method(
        self: AccuracyCalculator,
        knn_labels: torch.Tensor | None = None,
        query_labels: torch.Tensor | None = None,
        not_lone_query_mask: torch.Tensor | None = None,
        label_counts: Any = None,
        **kwargs: Any,
    ) -> MetricValue:
        arguments = _legacy_arguments(knn_labels, query_labels, not_lone_query_mask, label_counts)
        return self._builtin_knn_metric(name, arguments, kwargs)

    return _named_method(method, name)


def _knn_metric_method_with_source_flag(name: str) -> Callable[..., MetricValue]:
    """A built-in k-NN metric method with 2.x's signature, ``ref_includes_query`` included."""

    def method(
        self: AccuracyCalculator,
        knn_labels: torch.Tensor | None = None,
        query_labels: torch.Tensor | None = None,
        not_lone_query_mask: torch.Tensor | None = None,
        ref_includes_query: bool = False,
        label_counts: Any = None,
        **kwargs: Any,
    ) -> MetricValue:
        arguments = _legacy_arguments(knn_labels, query_labels, not_lone_query_mask, label_counts)
        arguments["ref_includes_query"] = ref_includes_query
        return self._builtin_knn_metric(name, arguments, kwargs)

    return _named_method(method, name)


class AccuracyCalculator:
    """Computes retrieval (k-NN) and clustering metrics of embeddings.

    Metrics (per query, over its retrieved neighbours in order; ``rel_i`` = neighbour
    ``i`` shares the query's label; ``R`` = references sharing it, not counting the query
    itself when the reference includes the query; ``P@i`` = precision of the first ``i``):

    - ``precision_at_1``: ``rel_1``.
    - ``r_precision``: relevant among the first ``min(R, k)``, divided by ``min(R, k)``.
    - ``mean_average_precision_at_r``: ``(1/R) * sum over i <= min(R, k) of P@i * rel_i``.
    - ``mean_average_precision`` (on request): ``(1/R) * sum over i <= k of P@i * rel_i``.
    - ``mean_reciprocal_rank`` (on request): ``1 / rank`` of the first relevant neighbour,
      0 when none is among the k.
    - ``recall_at_<K>``, ``precision_at_<K>``, ``mean_average_precision_at_<K>``,
      ``ndcg_at_<K>`` (on request, any ``K >= 1``): any of the first ``K`` relevant;
      relevant among the first ``K`` over ``K``; 2.x's ``mean_average_precision`` with
      ``k=K``; NDCG@K with binary relevance. Their ``K`` comes from the name, not ``k``.
    - ``NMI``, ``AMI``: normalized and adjusted mutual information (arithmetic
      normalization, as scikit-learn) between the query labels and a k-means clustering
      of the query embeddings with one cluster per distinct query label.

    Queries whose label has ``R = 0`` ("lone" queries) are left out of every k-NN metric;
    when every query is lone those metrics are NaN, with a logged warning. Values are averaged
    over queries in float64.

    Args:
        include: Metrics to compute; empty means every metric except those on request.
        exclude: Metrics not to compute.
        avg_of_avgs: Average each k-NN metric per label first, then over labels.
        return_per_class: Return each k-NN metric as a list of per-label averages, ordered
            by label, one for each label that has non-lone queries.
        k: Neighbours to consider. ``None``: as many as each metric needs, and every
            reference for ``mean_average_precision`` and ``mean_reciprocal_rank``
            (quadratic output). ``"max_bin_count"``: the largest ``R``. An int: at most
            that many; R-precision and MAP@R are wrong (with a logged warning) when it is below
            the largest ``R``. An int above the number of references is clamped to it,
            with a warning, whatever the backend.
        label_comparison_fn: ``fn(a, b) -> bool tensor`` comparing labels elementwise with
            broadcasting over leading dimensions (for multi-dimensional labels). Not
            allowed with the clustering metrics.
        device: Where to compute; ``None`` keeps the inputs' device.
        knn_func: A k-NN backend spec (callable, backend name, or mapping with a
            ``"name"``). Default: ``CustomKNN(LpDistance(normalize_embeddings=False,
            power=2))``, exact squared Euclidean search in tiles sized by a memory budget.
        kmeans_func: A k-means backend spec. Default: :class:`TorchKMeans`.
        knn_output_budget: Bytes of k-NN outputs (distances, indices and relevance of
            every query's ``k`` neighbours) one call may hold at once; also the attribute
            of that name. Above it, the built-in k-NN metrics are computed block by block
            of queries (each block searched against the whole reference, its per-query
            values kept, its neighbours dropped), so memory follows the budget rather than
            ``num_queries x k``; the results are those of the whole outputs. Subclasses'
            own k-NN metrics, overridden metric methods and backends other than
            ``CustomKNN`` keep the whole outputs (logged). ``None``: never in blocks.
            Default: 32 MiB.

    Example:
        >>> import torch
        >>> query = torch.tensor([[0.0], [0.1], [1.0], [1.2], [5.0]])
        >>> labels = torch.tensor([0, 0, 1, 1, 2])
        >>> calc = AccuracyCalculator(include=("precision_at_1", "r_precision"))
        >>> calc.get_accuracy(query, labels)
        {'precision_at_1': 1.0, 'r_precision': 1.0}
    """

    function_keyword = "calculate_"

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: int | str | None = None,
        label_comparison_fn: LabelComparison | None = None,
        device: torch.device | str | None = None,
        knn_func: Spec | None = None,
        kmeans_func: Spec | None = None,
        *,
        knn_output_budget: int | None = KNN_OUTPUT_BUDGET,
    ) -> None:
        self._all_functions = self._discover_functions()
        self.check_primary_metrics(include, exclude)
        self.original_function_dict = self._select(include, exclude)
        self.curr_function_dict = dict(self.original_function_dict)
        if avg_of_avgs and return_per_class:
            raise InvalidArgumentError(
                "The 'avg_of_avgs' and 'return_per_class' parameters of AccuracyCalculator "
                "are mutually exclusive. Got both True instead."
            )
        self.avg_of_avgs = bool(avg_of_avgs)
        self.return_per_class = bool(return_per_class)
        self.k = k
        self.label_comparison_fn = self._check_comparison(label_comparison_fn)
        self.device = check_device(device, OWNER)
        self.knn_func = _default_knn() if knn_func is None else load_knn_func(knn_func)
        self.kmeans_func = TorchKMeans() if kmeans_func is None else load_kmeans_func(kmeans_func)
        self.knn_output_budget = knn_output_budget
        # What the spot-check of the last search measured (exact or approximate, recall).
        self.last_knn_check: SpotCheck | None = None
        # Queries of the last get_accuracy left out of the k-NN metrics (no valid relevant
        # reference: lone, or every relevant reference excluded by the protocol).
        self.last_num_queries_left_out = 0

    def __repr__(self) -> str:
        return (
            f"AccuracyCalculator(include={tuple(self.get_curr_metrics())}, k={self.k!r}, "
            f"avg_of_avgs={self.avg_of_avgs}, return_per_class={self.return_per_class}, "
            f"knn_func={self.knn_func!r}, kmeans_func={self.kmeans_func!r}, "
            f"knn_output_budget={self.knn_output_budget!r})"
        )

    # ----- metric selection (the 2.x method names) -----

    def _discover_functions(self) -> dict[str, Callable[..., MetricValue]]:
        names = [name for name in dir(self) if name.startswith(self.function_keyword)]
        return {name[len(self.function_keyword) :]: getattr(self, name) for name in names}

    def check_primary_metrics(
        self, include: Sequence[str] = (), exclude: Sequence[str] = ()
    ) -> None:
        """Raise ``TypeError``/``ValueError`` unless both are lists or tuples of metric names."""
        known = sorted(self._all_functions)
        for param, names in (("include", include), ("exclude", exclude)):
            if not isinstance(names, (tuple, list)):
                raise invalid(
                    param, OWNER, "a tuple or list of metric names", names, InvalidTypeError
                )
            unknown = [name for name in names if not self._is_metric(name)]
            if unknown:
                raise invalid(
                    param,
                    OWNER,
                    f"a tuple of names among {known} or of the families {describe_families()}",
                    tuple(names),
                )

    def get_function_dict(
        self, include: Sequence[str] = (), exclude: Sequence[str] = ()
    ) -> dict[str, Callable[..., MetricValue]]:
        """The metrics chosen at construction, narrowed by ``include`` and ``exclude``.

        As in 2.x, ``calc._get_accuracy(calc.get_function_dict(), **kwargs)`` computes
        exactly the metrics the calculator was built with.

        Example:
            >>> calc = AccuracyCalculator(exclude=("NMI", "AMI"))
            >>> sorted(calc.get_function_dict(exclude=("r_precision",)))
            ['mean_average_precision_at_r', 'precision_at_1']
        """
        names = list(include) if len(include) else list(self.original_function_dict)
        return {
            name: function
            for name, function in self.original_function_dict.items()
            if name in names and name not in exclude
        }

    def _select(
        self, include: Sequence[str], exclude: Sequence[str]
    ) -> dict[str, Callable[..., MetricValue]]:
        """``include`` (default: all but the on-request metrics) less ``exclude``."""
        if len(include) == 0:
            include = [name for name in self._all_functions if name not in ON_REQUEST_METRICS]
        functions = {
            name: function
            for name, function in self._all_functions.items()
            if name in include and name not in exclude
        }
        return {**functions, **self._parametrized_functions(include, exclude)}

    def _is_metric(self, name: str) -> bool:
        return name in self._all_functions or parse_metric_name(name) is not None

    def _parametrized_functions(
        self, include: Sequence[str], exclude: Sequence[str]
    ) -> dict[str, Callable[..., MetricValue]]:
        """``recall_at_<K>`` and the other families, in the order ``include`` names them."""
        names = [name for name in include if name not in self._all_functions]
        return {
            name: functools.partial(self._calculate_parametrized, name, metric)
            for name in dict.fromkeys(names)
            if name not in exclude and (metric := parse_metric_name(name)) is not None
        }

    def _uses_knn(self, name: str) -> bool:
        return name in self.requires_knn() or (
            name not in self._all_functions and parse_metric_name(name) is not None
        )

    def get_curr_metrics(self) -> list[str]:
        """Names of the metrics this calculator computes by default."""
        return list(self.curr_function_dict)

    def requires_clustering(self) -> list[str]:
        """Metrics that need a k-means clustering of the query (extend in subclasses)."""
        return ["NMI", "AMI"]

    def requires_knn(self) -> list[str]:
        """Metrics that need nearest neighbours (extend in subclasses)."""
        return [
            "precision_at_1",
            "mean_average_precision",
            "mean_average_precision_at_r",
            "mean_reciprocal_rank",
            "mean_inverse_negative_penalty",
            "r_precision",
        ]

    def description(self) -> str:
        """``"avg_of_avgs"`` when averaging per label first, else ``""`` (used in key names)."""
        return "avg_of_avgs" if self.avg_of_avgs else ""

    def determine_k(
        self, bin_counts: Any, num_reference_embeddings: int, ref_includes_query: bool
    ) -> int:
        """The ``k`` that 2.x searched with, from the reference matches of each query label.

        ``"max_bin_count"`` gives the largest count (less the query itself), ``None`` every
        reference, an int itself (logging a warning when it is below the largest count and
        R-precision or MAP@R is selected). A subclass that overrides this method chooses
        the ``k`` of every search.

        Example:
            >>> AccuracyCalculator(k="max_bin_count").determine_k(torch.tensor([3, 5]), 20, True)
            4
        """
        self_count = int(ref_includes_query)
        max_bin_count = int(torch.as_tensor(bin_counts).max())
        if self.k == "max_bin_count":
            return max_bin_count - self_count
        if self.k is None:
            return num_reference_embeddings - self_count
        k = _check_k(self.k)
        if not isinstance(k, int):
            raise invalid("k", OWNER, "a positive int, None or 'max_bin_count'", k)
        r_names = [name for name in self.get_curr_metrics() if name in _R_METRICS]
        if k < max_bin_count and r_names:
            _log_small_k(r_names, k, max_bin_count)
        return k

    def _check_comparison(self, fn: LabelComparison | None) -> LabelComparison:
        if fn is None or fn is EQUALITY:
            return EQUALITY
        if not callable(fn):
            raise invalid("label_comparison_fn", OWNER, "a callable or None", fn, InvalidTypeError)
        clustering = [
            name for name in self.get_curr_metrics() if name in self.requires_clustering()
        ]
        if clustering:
            raise _UnsupportedCombinationError(
                f"The 'label_comparison_fn' parameter of AccuracyCalculator cannot be used with "
                f"the clustering metrics {clustering}; exclude them, e.g. exclude={tuple(clustering)}."
            )
        return fn

    @property
    def k(self) -> int | str | None:
        """Neighbours per query (see the class's Args); checked whenever it is set."""
        return self._k

    @k.setter
    def k(self, value: Any) -> None:
        self._k = _check_k(value)

    @property
    def knn_output_budget(self) -> int | None:
        """Bytes of k-NN outputs held at once (see the class's Args); checked whenever it
        is set."""
        return self._knn_output_budget

    @knn_output_budget.setter
    def knn_output_budget(self, value: Any) -> None:
        self._knn_output_budget = _check_budget(value)

    @property
    def _custom_comparison(self) -> LabelComparison | None:
        return None if self.label_comparison_fn is EQUALITY else self.label_comparison_fn

    # ----- the computation -----

    def get_accuracy(
        self,
        query: torch.Tensor,
        query_labels: torch.Tensor,
        reference: torch.Tensor | None = None,
        reference_labels: torch.Tensor | None = None,
        ref_includes_query: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        return_per_query: bool = False,
        query_categories: Any = None,
        return_per_category: bool | None = None,
        *,
        query_groups: torch.Tensor | None = None,
        reference_groups: torch.Tensor | None = None,
        junk_labels: Sequence[Any] = (),
        distractor_labels: Sequence[Any] = (),
        excluded_pairs: torch.Tensor | None = None,
        is_query: torch.Tensor | None = None,
        is_reference: torch.Tensor | None = None,
        single_gallery_shot: bool = False,
        single_gallery_shot_draws: int | None = None,
    ) -> dict[str, MetricValue]:
        """Compute the selected metrics.

        Args:
            query: ``(num_queries, dims)`` float embeddings, finite.
            query_labels: One label (or label row) per query; never cast to float.
            reference: ``(num_references, dims)`` embeddings to retrieve from. ``None``
                retrieves from the query itself (and sets ``ref_includes_query``).
            reference_labels: Labels of ``reference``; required with it.
            ref_includes_query: The first ``len(query)`` rows of ``reference`` (and of its
                labels) are the query; each query's own row is not retrieved.
            include: Metrics for this call only (any known metric); empty means the
                calculator's metrics. The calculator's state is not changed.
            exclude: Metrics to leave out of this call.
            return_per_query: Also return, under the key ``"per_query"``, a
                :class:`PerQueryValues`: each built-in or parametrized k-NN metric's float64
                value for every non-lone query, and those queries' indices and labels (for
                slicing by class, finding failures, and :func:`bootstrap_intervals`); its
                ``cmc_curve(max_rank)`` is the CMC curve.
            query_categories: A category per query (e.g. Stanford Online Products'
                super-category): a 1-D integer tensor or array, or a sequence of ints or
                strings. Every metric is then also reported per category.
            return_per_category: Return, under the key ``"per_category"``, ``{category:
                {metric name: value}}`` with the categories in sorted order, each as
                ``get_accuracy`` computes it on that category's queries alone against the
                same reference. ``None`` (default): when ``query_categories`` is given.
            query_groups: One integer group id (e.g. a camera id) per query: a reference
                with the query's label *and* group is not a candidate (the
                re-identification protocol). With ``reference=None`` (or the roles
                below), one id per embedding and no ``reference_groups``.
            reference_groups: One integer group id per reference; required with
                ``query_groups`` when ``reference`` is given.
            junk_labels: Reference labels that are no query's candidate (Market-1501:
                ``(-1,)``). 1-D labels only. A list, tuple, tensor or numpy array;
                compared exactly: a value no label can equal (1.5 against integer labels,
                257 against uint8 labels) matches nothing.
            distractor_labels: Reference labels that are candidates but never relevant
                (Market-1501: ``(0,)``). 1-D labels only; accepted and compared as
                ``junk_labels``.
            excluded_pairs: ``(m, 2)`` integer tensor of ``(query row, reference row)``
                pairs that are not candidates (rows of the one set with the roles below).
            is_query, is_reference: Bool flags over one set of embeddings (``query``,
                with ``reference=None``): which rows are queries and which references
                (a row may be both; it never retrieves itself).
            single_gallery_shot: torchreid's CUHK03 single-gallery-shot mode: each query's
                ``recall_at_K``, ``precision_at_1`` and CMC curve are those of a subset of
                its candidates holding one per identity, drawn at random; reported as the
                exact expectation over the draws (no randomness). The other metrics stay
                over all candidates. Every candidate is ranked (as with ``k=None``).
            single_gallery_shot_draws: With ``single_gallery_shot``, make this many random
                draws per query instead (NumPy's global random state, in torchreid's order:
                the same seed gives torchreid's numbers).

        Under any of the protocol options above, a query's relevant references are those
        that share its label, are candidates and are not distractors; ``R`` counts them,
        and queries with none are left out of the k-NN metrics and counted (logged, and
        kept in ``last_num_queries_left_out``). Excluded pairs are left out inside the
        search, tile by tile (no dense mask). See docs/protocols.md.

        Returns:
            ``{metric name: float}`` (lists of per-label floats for k-NN metrics with
            ``return_per_class``), plus ``"per_query"`` with ``return_per_query`` and
            ``"per_category"`` with categories.

        Raises:
            ValueError: for NaN or infinite embeddings, mismatched lengths, a reference
                that does not start with the query when ``ref_includes_query`` is set, or a
                k-NN backend whose output has the wrong shape or indices outside the
                reference.
        """
        inputs = (query, query_labels, reference, reference_labels, ref_includes_query)
        protocol = {
            "query_groups": query_groups,
            "reference_groups": reference_groups,
            "junk_labels": junk_labels,
            "distractor_labels": distractor_labels,
            "excluded_pairs": excluded_pairs,
            "is_query": is_query,
            "is_reference": is_reference,
            "single_gallery_shot": single_gallery_shot,
            "single_gallery_shot_draws": single_gallery_shot_draws,
        }
        call = self._prepared_call(
            (query, query_labels, reference, reference_labels, ref_includes_query),
            ProtocolOptions.of(
                query_groups, reference_groups, junk_labels, distractor_labels, excluded_pairs
            ),
            (is_query, is_reference),
            (single_gallery_shot, single_gallery_shot_draws),
        )
        query, query_labels, reference, reference_labels = call.tensors
        ref_includes_query = call.ref_includes_query
        check_has_rows(query, reference, f"{OWNER}.get_accuracy")  # one process has them all
        check_has_columns(query, f"{OWNER}.get_accuracy")
        categories = _categories_for_call(query_categories, return_per_category, query)
        functions = self._functions_for_call(include, exclude)
        kwargs: dict[str, Any] = {
            "query": query,
            "reference": reference,
            "query_labels": query_labels,
            "reference_labels": reference_labels,
            "ref_includes_query": ref_includes_query,
            "label_comparison_fn": self.label_comparison_fn,
        }
        if call.options is not None:
            kwargs["protocol_options"] = (call.options, call.self_rows)
            kwargs["single_shot"] = call.single_shot
        with adapted_threads(len(query) * len(reference), query.device):
            if any(self._uses_knn(name) for name in functions):
                kwargs.update(self._knn_kwargs(functions, **kwargs))
            if any(name in self.requires_clustering() for name in functions):
                kwargs["cluster_labels"] = self._checked_cluster_labels(kwargs)
            with torch.no_grad():
                results = self._get_accuracy(functions, **kwargs)
                if return_per_query:
                    per_query = self._per_query(functions, kwargs)
                    rows = per_query.query_indices
                    per_query.query_rows = (
                        rows if call.roles is None else call.roles.query_rows[rows]
                    )
                    per_query.computed_under = protocol_record(self.k, inputs, protocol)
                    results["per_query"] = per_query
                if categories is not None:
                    results["per_category"] = self._per_category(functions, kwargs, categories)
        kwargs.clear()  # release the k-NN outputs before returning
        return results

    def rank_candidates(
        self,
        rows: Any,
        query: torch.Tensor,
        query_labels: torch.Tensor,
        reference: torch.Tensor | None = None,
        reference_labels: torch.Tensor | None = None,
        ref_includes_query: bool = False,
        *,
        query_groups: torch.Tensor | None = None,
        reference_groups: torch.Tensor | None = None,
        junk_labels: Sequence[Any] = (),
        distractor_labels: Sequence[Any] = (),
        excluded_pairs: torch.Tensor | None = None,
        is_query: torch.Tensor | None = None,
        is_reference: torch.Tensor | None = None,
        single_gallery_shot: bool = False,
        single_gallery_shot_draws: int | None = None,
    ) -> list[CandidateRanking]:
        """Every candidate of some queries, ranked, as :meth:`get_accuracy` ranks them.

        For views of the per-query results (the worst queries' table and picture): the
        same arguments as :meth:`get_accuracy`, so the same candidates (the protocol's
        exclusions, junk and roles applied; distractors never relevant). The single-shot
        options change no candidate (they are checked alike): the single-shot CMC draws
        from this ranking.

        Args:
            rows: Query indices as :attr:`PerQueryValues.query_indices` numbers them (the
                rows of ``query``, or under ``is_query`` the position among the queries).
            query, query_labels, reference, reference_labels, ref_includes_query: As for
                :meth:`get_accuracy`.

        Returns:
            One :class:`CandidateRanking` per row, in the order of ``rows``.
        """
        call = self._prepared_call(
            (query, query_labels, reference, reference_labels, ref_includes_query),
            ProtocolOptions.of(
                query_groups, reference_groups, junk_labels, distractor_labels, excluded_pairs
            ),
            (is_query, is_reference),
            (single_gallery_shot, single_gallery_shot_draws),
        )
        query, query_labels, reference, reference_labels = call.tensors
        rows = torch.as_tensor(rows, dtype=torch.long, device=query.device).reshape(-1)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= len(query)):
            raise invalid(
                "rows", f"{OWNER}.rank_candidates", f"query indices in [0, {len(query)})", rows
            )
        exclusion, distractors = self._exclusion_of(call)
        distances, indices, valid = search_excluding(
            self.knn_func,
            query[rows],
            len(reference),
            reference,
            exclusion.for_queries(rows),
            caller=OWNER,
        )
        relevant = (reference_labels[indices] == query_labels[rows].unsqueeze(1)) & valid
        if distractors is not None:
            relevant &= ~distractors[indices]
        roles = call.roles
        return [
            CandidateRanking(
                int(row if roles is None else roles.query_rows[row]),
                row_distances[row_valid].cpu(),
                (row_indices if roles is None else roles.reference_rows[row_indices])[
                    row_valid
                ].cpu(),
                row_relevant[row_valid].cpu(),
            )
            for row, row_distances, row_indices, row_valid, row_relevant in zip(
                rows.tolist(), distances, indices, valid, relevant
            )
        ]

    def _exclusion_of(self, call: _Call) -> tuple[Exclusion, torch.Tensor | None]:
        """The candidate rules of a prepared call, and its distractor flags (or None)."""
        query, query_labels, reference, reference_labels = call.tensors
        if call.options is None:
            self_rows = torch.arange(len(query), device=query.device)
            rules = [(self_rows, torch.arange(len(reference), device=query.device))]
            exclusion = Exclusion(
                len(query), len(reference), rules if call.ref_includes_query else ()
            )
            return exclusion, None
        stats = label_stats(query_labels, reference_labels, False)
        protocol = build_protocol(
            call.options, stats, (query_labels, reference_labels), call.self_rows
        )
        return protocol.exclusion, protocol.distractors

    def _prepared_call(
        self,
        inputs: tuple[Any, Any, Any, Any, bool],
        options: ProtocolOptions,
        flags: tuple[Any, Any],
        single_shot_arguments: tuple[Any, Any],
    ) -> _Call:
        """The checked inputs of one call and, under a protocol, its checked options
        (the one preparation of :meth:`get_accuracy` and :meth:`rank_candidates`)."""
        query, query_labels, reference, reference_labels, ref_includes_query = inputs
        roles = flags[0] is not None or flags[1] is not None
        if roles:
            _check_one_set(
                reference, reference_labels, ref_includes_query, options.reference_groups
            )
        tensors = self._inputs(query, query_labels, reference, reference_labels, ref_includes_query)
        single_shot = single_shot_option(*single_shot_arguments)
        if not (roles or options.active or single_shot is not None):
            return _Call(tensors[:4], tensors[4])
        self.check_protocol_allowed(_given_protocol_arguments(options, roles, single_shot))
        check_no_overlap(options)
        found = _protocol_inputs(tensors, options, flags if roles else None)
        # the self matches are a rule of the protocol: ref_includes_query becomes False
        return _Call(found[:4], False, found[4], found[5], single_shot, found[6])

    def _get_accuracy(
        self, function_dict: dict[str, Callable[..., MetricValue]], **kwargs: Any
    ) -> dict[str, MetricValue]:
        return {name: function(**kwargs) for name, function in function_dict.items()}

    def _functions_for_call(
        self, include: Sequence[str], exclude: Sequence[str]
    ) -> dict[str, Callable[..., MetricValue]]:
        self.check_primary_metrics(include, exclude)
        names = list(include) if include else self.get_curr_metrics()
        functions = {
            name: function
            for name, function in self._all_functions.items()
            if name in names and name not in exclude
        }
        functions.update(self._parametrized_functions(names, exclude))
        clustering = [name for name in functions if name in self.requires_clustering()]
        if clustering and self._custom_comparison is not None:
            raise _UnsupportedCombinationError(
                f"The clustering metrics {clustering} cannot be computed with the custom "
                "'label_comparison_fn' of AccuracyCalculator; exclude them."
            )
        return functions

    def _inputs(
        self,
        query: Any,
        query_labels: Any,
        reference: Any,
        reference_labels: Any,
        ref_includes_query: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        if reference is None:
            if reference_labels is not None:
                raise InvalidArgumentError(
                    "The 'reference_labels' parameter of AccuracyCalculator.get_accuracy must "
                    "be None when 'reference' is None (the query is its own reference)."
                )
            reference, reference_labels, ref_includes_query = query, query_labels, True
        elif reference_labels is None:
            raise invalid(
                "reference_labels",
                "AccuracyCalculator.get_accuracy",
                "a tensor of labels when 'reference' is given",
                None,
            )
        same = reference is query  # a self-search passes one tensor object as both
        query = self._embeddings(query, "query")
        reference = query if same else self._embeddings(reference, "reference")
        query_labels = self._labels(query_labels, "query_labels", query)
        reference_labels = self._labels(reference_labels, "reference_labels", reference)
        check_same_device(query, reference, "query and reference", OWNER)
        if query.shape[1] != reference.shape[1]:
            raise invalid(
                "reference",
                "AccuracyCalculator.get_accuracy",
                f"embeddings with {query.shape[1]} columns like the query",
                f"{reference.shape[1]} columns",
            )
        if query_labels.shape[1:] != reference_labels.shape[1:]:
            raise invalid(
                "reference_labels",
                "AccuracyCalculator.get_accuracy",
                f"labels of shape (n, *{tuple(query_labels.shape[1:])}) like the query's",
                f"shape {tuple(reference_labels.shape)}",
            )
        if ref_includes_query:
            _check_reference_starts_with_query(query, query_labels, reference, reference_labels)
        return query, query_labels, reference, reference_labels, bool(ref_includes_query)

    def _embeddings(self, value: Any, param: str) -> torch.Tensor:
        tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        tensor = check_plain_tensor(tensor, param, f"{OWNER}.get_accuracy")
        if isinstance(tensor, torch.Tensor) and self.device is not None:
            tensor = tensor.to(self.device)
        if isinstance(tensor, torch.Tensor):
            tensor = float_if_integer(tensor)
        return check_embeddings(tensor, param, "AccuracyCalculator.get_accuracy")

    def _labels(self, value: Any, param: str, embeddings: torch.Tensor) -> torch.Tensor:
        if isinstance(value, np.ndarray):
            try:
                value = torch.from_numpy(value)
            except TypeError:
                raise invalid(
                    param,
                    "AccuracyCalculator.get_accuracy",
                    "numeric labels",
                    value.dtype,
                    InvalidTypeError,
                ) from None
        if not isinstance(value, torch.Tensor):
            raise invalid(
                param,
                "AccuracyCalculator.get_accuracy",
                "a torch.Tensor",
                type(value).__name__,
                InvalidTypeError,
            )
        value = check_plain_tensor(value, param, f"{OWNER}.get_accuracy")
        value = check_labels_not_nan(value.to(embeddings.device), param, f"{OWNER}.get_accuracy")
        if value.ndim == 0 or len(value) != len(embeddings):
            raise invalid(
                param,
                "AccuracyCalculator.get_accuracy",
                f"one label per embedding ({len(embeddings)})",
                f"shape {tuple(value.shape)}",
            )
        return value

    # ----- k-NN -----

    def _knn_kwargs(self, functions: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        query, reference = kwargs["query"], kwargs["reference"]
        query_labels, reference_labels = kwargs["query_labels"], kwargs["reference_labels"]
        ref_includes_query = kwargs["ref_includes_query"]
        comparison = self._custom_comparison
        stats = label_stats(query_labels, reference_labels, ref_includes_query, comparison)
        protocol = None
        if kwargs.get("protocol_options") is not None:
            options, self_rows = kwargs["protocol_options"]
            protocol = build_protocol(options, stats, (query_labels, reference_labels), self_rows)
            stats = protocol_stats(stats, protocol)
        not_lone = stats.not_lone
        self.last_num_queries_left_out = int((~not_lone).sum())
        if not bool(not_lone.any()):
            logger.warning(
                "None of the query labels are in the reference set%s: the k-NN metrics are NaN.",
                "" if protocol is None else " as valid relevant references (after exclusions)",
            )
        k = self._neighbours_needed(
            list(functions), stats, len(reference) - int(ref_includes_query)
        )
        if _overrides(type(self), "determine_k"):
            k = min(
                self.determine_k(stats.match_counts, len(reference), ref_includes_query),
                len(reference) - int(ref_includes_query),
            )
        single_shot = kwargs.get("single_shot")
        _log_search(k, self.k, single_shot, len(reference))
        found = {
            "label_counts": (stats.unique_query_labels, stats.match_counts),
            "lone_query_labels": _lone_labels(stats),
            "not_lone_query_mask": not_lone,
            "label_stats": stats,
        }
        blocks = self._blocks(functions, kwargs, k, protocol)
        if blocks is not None:
            self.last_knn_check = None
            labels = (query_labels, reference_labels)
            names = [name for name in functions if per_query_function(name) is not None]
            values = blocked_values(blocks, k, names, stats, labels, comparison, _METRIC_BLOCK)
            empty = {key: None for key in ("knn_labels", "knn_distances", "knn_indices")}
            return {**found, **empty, "relevance": None, "knn_values": values}
        single_shot_cmc = None
        if protocol is None:
            distances, indices = self._search(query, k, reference, ref_includes_query)
        elif single_shot is None:
            distances, indices, valid = self._search_excluding(query, k, reference, protocol)
        else:  # the single-shot draw needs every candidate ranked
            distances, indices, valid = self._search_excluding(
                query, len(reference), reference, protocol
            )
            ranked = relevance_of(stats, indices, query_labels, None)
            ranked = protocol_relevance(ranked, indices, valid, protocol)
            single_shot_cmc = _single_shot_cmc(
                single_shot, functions, stats, indices, valid, ranked
            )
            # the other metrics see their k; copies, so the full ranking is released
            distances, indices, valid = (t[:, :k].clone() for t in (distances, indices, valid))
        needs_labels = comparison is not None or bool(self._custom_knn_metrics(list(functions)))
        knn_labels = reference_labels[indices] if needs_labels else None
        relevance = relevance_of(stats, indices, query_labels, knn_labels, comparison)
        if protocol is not None:
            relevance = protocol_relevance(relevance, indices, valid, protocol)
        return {
            **found,
            "knn_labels": knn_labels,
            "knn_distances": distances,
            "knn_indices": indices,
            "relevance": relevance,
            "single_shot_cmc": single_shot_cmc,
        }

    def _blocks(
        self, functions: dict[str, Any], kwargs: dict[str, Any], k: int, protocol: Any
    ) -> Blocks | None:
        """How to compute the k-NN metrics block by block of queries, or None for the whole
        outputs (within ``knn_output_budget``, or not exact in blocks: logged)."""
        query, reference = kwargs["query"], kwargs["reference"]
        distance_bytes = query.element_size()
        budget = self.knn_output_budget
        if budget is None or output_bytes(len(query), k, distance_bytes) <= budget:
            return None
        reason = self._whole_outputs_reason(list(functions), kwargs)
        if reason:
            logger.info(
                "AccuracyCalculator: the k-NN outputs (%d queries x k=%d) exceed "
                "knn_output_budget (%d bytes), but %s: computing from the whole outputs.",
                len(query),
                k,
                budget,
                reason,
            )
            return None
        blocks = Blocks(
            self.knn_func,
            query,
            reference,
            kwargs["ref_includes_query"],
            protocol,
            Blocks.rows_for(budget, k, distance_bytes),
            OWNER,
            Blocks.reference_rows_for(self.knn_func, query, reference, protocol),
        )
        logger.info(
            "AccuracyCalculator: k-NN metrics in %d blocks of %d queries (knn_output_budget "
            "%d bytes)",
            blocks.count(),
            blocks.rows,
            budget,
        )
        return blocks

    def _whole_outputs_reason(self, names: list[str], kwargs: dict[str, Any]) -> str:
        """Why the k-NN metrics need every query's neighbours at once ("" when they don't)."""
        if kwargs.get("single_shot") is not None:
            return "single_gallery_shot ranks every candidate of each query"
        custom = self._custom_knn_metrics(names)
        if custom:
            return f"the metrics {custom} are not built in (they take the whole knn_labels)"
        if type(self.knn_func) is not CustomKNN:
            return "the knn_func is not CustomKNN"
        overridden = [
            name for name in ("_get_accuracy", "_knn_kwargs") if _overrides(type(self), name)
        ]
        if overridden:
            return f"the subclass overrides {overridden}"
        return ""

    def _neighbours_needed(self, names: list[str], stats: LabelStats, available: int) -> int:
        """The most neighbours any selected k-NN metric needs, clamped to the reference."""
        builtin = [
            name for name in names if name in self.requires_knn() and _is_builtin(type(self), name)
        ]
        needs = (
            [self._k_neighbours(stats.max_bin_count, available)]
            if self._custom_knn_metrics(names)
            else []
        )
        if bool(stats.not_lone.any()):  # else every built-in metric is NaN without searching
            needs += [metric.k for metric in self._parametrized_in(names)]
            if any(name in _ONE_NEIGHBOUR_METRICS for name in builtin):
                needs.append(1)
            r_names = [name for name in builtin if name in _R_METRICS]
            if r_names:
                needs.append(self._r_neighbours(stats.max_bin_count, r_names))
            if any(name not in _ONE_NEIGHBOUR_METRICS | _R_METRICS for name in builtin):
                needs.append(self._k_neighbours(stats.max_bin_count, available))
        return min(max(needs, default=0), max(available, 0))

    def _custom_knn_metrics(self, names: list[str]) -> list[str]:
        """k-NN metrics of a subclass, which get ``knn_labels`` and their own k."""
        return [
            name
            for name in names
            if name in self.requires_knn() and not _is_builtin(type(self), name)
        ]

    def _parametrized_in(self, names: list[str]) -> list[Any]:
        parsed = [parse_metric_name(name) for name in names if name not in self._all_functions]
        return [metric for metric in parsed if metric is not None]

    def _r_neighbours(self, max_bin_count: int, names: list[str]) -> int:
        if isinstance(self.k, int) and self.k < max_bin_count:
            _log_small_k(names, self.k, max_bin_count)
            return self.k
        return max_bin_count

    def _k_neighbours(self, max_bin_count: int, available: int) -> int:
        """Neighbours for metrics that use all k: k, the max bin count, or every reference."""
        if self.k is None:
            return available
        if isinstance(self.k, str):  # "max_bin_count"
            return max_bin_count
        if self.k > available:
            warn_external(
                f"The 'k' parameter of AccuracyCalculator ({self.k}) is larger than the "
                f"{available} references that can be retrieved; using k={available}."
            )
        return int(self.k)

    def _search(
        self, query: torch.Tensor, k: int, reference: torch.Tensor, ref_includes_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Call the backend once (or not at all for k=0) through the form and content
        checks (:func:`search_knn`); an approximate backend's recall is logged."""
        if k == 0:
            empty = torch.empty((len(query), 0), device=query.device)
            return empty, empty.long()
        result, self.last_knn_check = search_knn(
            self.knn_func, query, k, reference, ref_includes_query, caller=OWNER
        )
        if self.last_knn_check is not None and not self.last_knn_check.exact:
            logger.warning("The k-NN metrics come from an %s.", self.last_knn_check.describe())
        return result

    def _search_excluding(
        self, query: torch.Tensor, k: int, reference: torch.Tensor, protocol: Protocol
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first k candidates of each query under the protocol's exclusion."""
        if k == 0:
            empty = torch.empty((len(query), 0), device=query.device)
            return empty, empty.long(), empty.bool()
        self.last_knn_check = None
        return search_excluding(
            self.knn_func, query, k, reference, protocol.exclusion, caller=OWNER
        )

    def check_protocol_allowed(
        self, given: Sequence[str], caller: str = f"{OWNER}.get_accuracy"
    ) -> None:
        """Refuse the protocol's arguments (named in ``given``, as ``caller`` takes them)
        when this calculator compares labels with a custom ``label_comparison_fn``: the
        protocol needs plain label equality. Testers call it when they are built, so the
        refusal comes before any embedding is computed.

        Raises:
            ValueError: (also a ``NotImplementedError``, as 2.x raised) naming both.

        Example:
            >>> AccuracyCalculator().check_protocol_allowed(["query_groups"])  # equality
        """
        if given and self._custom_comparison is not None:
            raise _UnsupportedCombinationError(
                f"The {', '.join(repr(name) for name in given)} parameter(s) of "
                f"{caller} need plain label equality; they cannot be "
                "used with the custom 'label_comparison_fn' of AccuracyCalculator (the groups, "
                "junk/distractor labels, excluded pairs, roles and single-gallery-shot mode "
                "all compare labels for equality)."
            )

    # ----- clustering -----

    def get_cluster_labels(
        self, query: torch.Tensor, query_labels: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        """k-means clusters of the query, one cluster per distinct query label."""
        num_clusters = len(_class_ids(query_labels).unique())
        with torch.no_grad():
            return self.kmeans_func(query, num_clusters)

    def _checked_cluster_labels(self, kwargs: dict[str, Any]) -> torch.Tensor:
        clusters = self.get_cluster_labels(**kwargs)
        query = kwargs["query"]
        if not isinstance(clusters, torch.Tensor):
            clusters = torch.as_tensor(np.asarray(clusters))
        if clusters.shape != (len(query),) or clusters.is_floating_point():
            raise InvalidArgumentError(
                f"The kmeans_func of AccuracyCalculator must return {len(query)} integer "
                f"cluster ids. Got {clusters.dtype} of shape {tuple(clusters.shape)} instead."
            )
        return clusters.to(query.device)

    # ----- the metrics -----

    def calculate_NMI(
        self, query_labels: torch.Tensor, cluster_labels: torch.Tensor, **kwargs: Any
    ) -> float:
        return normalized_mutual_info(_class_ids(query_labels), cluster_labels)

    def calculate_AMI(
        self, query_labels: torch.Tensor, cluster_labels: torch.Tensor, **kwargs: Any
    ) -> float:
        return adjusted_mutual_info(_class_ids(query_labels), cluster_labels)

    # The k-NN metrics take the keyword arguments 2.x passed, in 2.x's order, so that
    # subclasses calling super() and code calling _get_accuracy with hand-made knn_labels
    # keep working; get_accuracy adds a relevance matrix and label statistics, which are
    # used instead when present.

    calculate_precision_at_1 = _knn_metric_method("precision_at_1")
    calculate_r_precision = _knn_metric_method_with_source_flag("r_precision")
    calculate_mean_average_precision_at_r = _knn_metric_method_with_source_flag(
        "mean_average_precision_at_r"
    )
    calculate_mean_average_precision = _knn_metric_method_with_source_flag("mean_average_precision")
    calculate_mean_reciprocal_rank = _knn_metric_method("mean_reciprocal_rank")
    calculate_mean_inverse_negative_penalty = _knn_metric_method("mean_inverse_negative_penalty")

    def _builtin_knn_metric(
        self, name: str, arguments: dict[str, Any], kwargs: dict[str, Any]
    ) -> MetricValue:
        """One built-in k-NN metric, from get_accuracy's statistics or from 2.x arguments."""
        if kwargs.get("label_stats") is not None and kwargs.get("knn_values") is not None:
            return self._averaged(kwargs["knn_values"].values[name], kwargs["label_stats"])
        if kwargs.get("label_stats") is not None and kwargs.get("relevance") is not None:
            metric = per_query_function(name)
            assert metric is not None  # every built-in k-NN metric has one
            column = _single_shot_column(single_shot_rank(name), kwargs)
            if column is not None:
                return self._averaged(column, kwargs["label_stats"])
            return self._knn_metric(metric, kwargs["relevance"], kwargs["label_stats"])
        if name == "mean_inverse_negative_penalty":
            raise InvalidArgumentError(
                "AccuracyCalculator.calculate_mean_inverse_negative_penalty is computed by "
                "get_accuracy (it did not exist in 2.x); call get_accuracy."
            )
        missing = [
            param
            for param in ("knn_labels", "query_labels", "label_counts")
            if arguments[param] is None
        ]
        if missing:
            raise InvalidArgumentError(
                f"AccuracyCalculator.calculate_{name} needs the keyword arguments {missing} "
                "(as 2.x passed them) when called outside get_accuracy."
            )
        options = (self.avg_of_avgs, self.return_per_class, self.label_comparison_fn)
        return legacy_knn_metric(
            name,
            arguments["knn_labels"],
            arguments["query_labels"],
            arguments["not_lone_query_mask"],
            arguments["label_counts"],
            bool(arguments.get("ref_includes_query", False)),
            options,
        )

    def _calculate_parametrized(
        self,
        name: str,
        metric: Callable[..., torch.Tensor],
        relevance: torch.Tensor | None,
        **kwargs: Any,
    ) -> MetricValue:
        column = _single_shot_column(single_shot_rank(getattr(metric, "name", "")), kwargs)
        if column is not None:
            return self._averaged(column, kwargs["label_stats"])
        if kwargs.get("knn_values") is not None:
            return self._averaged(kwargs["knn_values"].values[name], kwargs["label_stats"])
        assert relevance is not None  # get_accuracy gives one or the other
        return self._knn_metric(metric, relevance, kwargs["label_stats"])

    def _per_query(self, functions: dict[str, Any], kwargs: dict[str, Any]) -> PerQueryValues:
        names = [name for name in functions if self._uses_knn(name)]
        builtin = [name for name in names if name not in self._custom_knn_metrics(names)]
        return collect_per_query(builtin, kwargs, _METRIC_BLOCK)

    def _per_category(
        self, functions: dict[str, Any], kwargs: dict[str, Any], categories: Categories
    ) -> dict[Any, dict[str, MetricValue]]:
        """Every selected metric on each category's queries alone (one search for all)."""
        clustering = any(name in self.requires_clustering() for name in functions)
        found = {}
        for name, mask in categories.masks():
            sliced = category_kwargs(kwargs, mask)
            if clustering:
                sliced["cluster_labels"] = self._checked_cluster_labels(sliced)
            found[name] = self._get_accuracy(functions, **sliced)
        return found

    def _knn_metric(
        self,
        metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        relevance: torch.Tensor,
        stats: LabelStats,
    ) -> MetricValue:
        """Apply a per-query metric to the non-lone queries and average as configured."""
        keep = stats.not_lone
        if not bool(keep.any()):
            return self._no_value(stats)
        values = per_query_values(metric, relevance[keep], stats.num_relevant[keep], _METRIC_BLOCK)
        return self._average_kept(values, stats)

    def _averaged(self, values: torch.Tensor, stats: LabelStats) -> MetricValue:
        """The average of per-query values (one per query, NaN for left-out queries)."""
        keep = stats.not_lone
        if not bool(keep.any()):
            return self._no_value(stats)
        return self._average_kept(values[keep], stats)

    def _no_value(self, stats: LabelStats) -> MetricValue:
        """NaN (per class with ``return_per_class``): every query was left out."""
        return [float("nan")] * stats.num_classes if self.return_per_class else float("nan")

    def _average_kept(self, values: torch.Tensor, stats: LabelStats) -> MetricValue:
        """The non-lone queries' values averaged as configured."""
        keep = stats.not_lone
        if not (self.avg_of_avgs or self.return_per_class):
            return metrics.average(values)
        per_class = metrics.average_per_class(values, stats.query_class[keep], stats.num_classes)
        if self.return_per_class:
            return per_class.tolist()
        return metrics.average(per_class)


def _single_shot_column(rank: int | None, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """Each query's single-shot CMC at ``rank`` when the call is in that mode, else None."""
    cmc = kwargs.get("single_shot_cmc")
    return None if cmc is None or rank is None else cmc[:, rank - 1]


def _single_shot_cmc(
    single_shot: SingleShot,
    functions: dict[str, Any],
    stats: LabelStats,
    indices: torch.Tensor,
    valid: torch.Tensor,
    relevance: torch.Tensor,
) -> torch.Tensor:
    """Every query's single-shot CMC (zero rows for the left-out queries), up to the
    largest rank a selected metric asks for, from the ranking of every candidate."""
    ranks = [single_shot_rank(name) for name in functions]
    max_rank = max((rank for rank in ranks if rank is not None), default=0)
    assert stats.reference_keys is not None  # the protocol's plain label equality
    keep = stats.not_lone
    identities = torch.where(valid, stats.reference_keys[indices], -1)[keep]
    if single_shot.draws is None:
        found = expected_cmc(identities, relevance[keep], max_rank)
    else:
        found = drawn_cmc(identities, relevance[keep], max_rank, single_shot.draws)
    cmc = torch.zeros(len(keep), max_rank, dtype=torch.float64, device=indices.device)
    cmc[keep] = found.to(indices.device)
    return cmc


def _lone_labels(stats: LabelStats) -> torch.Tensor:
    """The distinct labels of the queries left out of the k-NN metrics."""
    lone_classes = torch.zeros(stats.num_classes, dtype=torch.bool, device=stats.not_lone.device)
    lone_classes[stats.query_class[~stats.not_lone]] = True
    return stats.unique_query_labels[lone_classes]


def _categories_for_call(
    query_categories: Any, return_per_category: bool | None, query: torch.Tensor
) -> Categories | None:
    """The checked categories when a per-category breakdown is asked for, else None."""
    if return_per_category is not None and not isinstance(return_per_category, bool):
        raise invalid(
            "return_per_category",
            f"{OWNER}.get_accuracy",
            "None, True or False",
            return_per_category,
            InvalidTypeError,
        )
    if query_categories is None:
        if return_per_category:
            raise invalid(
                "query_categories",
                f"{OWNER}.get_accuracy",
                "a category per query when return_per_category is True",
                None,
            )
        return None
    categories = check_categories(query_categories, len(query), query.device)
    return None if return_per_category is False else categories


def _log_search(k: int, setting: Any, single_shot: SingleShot | None, num_reference: int) -> None:
    """What the search retrieves: ``k`` neighbours, or (single-gallery-shot) every candidate."""
    if single_shot is None:
        logger.info("AccuracyCalculator: k=%d neighbours per query (k=%r)", k, setting)
        return
    how = (
        "the exact expectation"
        if single_shot.draws is None
        else f"{single_shot.draws} random draws per query"
    )
    logger.info(
        "AccuracyCalculator: every candidate among the %d references ranked per query for the "
        "single-gallery-shot CMC (%s); the other k-NN metrics use the first %d (k=%r)",
        num_reference,
        how,
        k,
        setting,
    )


def _log_small_k(names: list[str], k: int, max_bin_count: int) -> None:
    """2.x logged this (not a UserWarning), so ``assertLogs`` and logging config see it."""
    logger.warning(
        "AccuracyCalculator computes %s with k=%d, below the max bin count (%d, the largest "
        "number of relevant references), so their values are wrong. Use k='max_bin_count' "
        "(or k=None). For MAP@k use 'mean_average_precision' instead of "
        "'mean_average_precision_at_r'.",
        names,
        k,
        max_bin_count,
    )


def _overrides(cls: type, attribute: str) -> bool:
    return getattr(cls, attribute) is not getattr(AccuracyCalculator, attribute)


def _default_knn() -> CustomKNN:
    return CustomKNN(LpDistance(normalize_embeddings=False, power=2))


def _check_budget(budget: Any) -> int | None:
    expected = "a positive int (bytes) or None"
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise invalid("knn_output_budget", OWNER, expected, budget, InvalidTypeError)
    if budget < 1:
        raise invalid("knn_output_budget", OWNER, expected, budget)
    return int(budget)


def _check_k(k: Any) -> int | str | None:
    if k is None or (isinstance(k, str) and k == "max_bin_count"):
        return k
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > 0:
        return int(k)
    raise invalid("k", OWNER, "a positive int, None or 'max_bin_count'", k)


def _is_builtin(cls: type, name: str) -> bool:
    attribute = AccuracyCalculator.function_keyword + name
    return getattr(cls, attribute, None) is getattr(AccuracyCalculator, attribute, object())


def _class_ids(labels: torch.Tensor) -> torch.Tensor:
    """1-D labels as they are; rows of multi-dimensional labels as ids of distinct rows."""
    if labels.ndim == 1:
        return labels
    return torch.unique(labels, dim=0, return_inverse=True)[1]


def _check_reference_starts_with_query(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    reference: torch.Tensor,
    reference_labels: torch.Tensor,
) -> None:
    num = len(query)
    if (
        len(reference) < num
        or not torch.equal(reference[:num], query)
        or not torch.equal(reference_labels[:num], query_labels)
    ):
        raise InvalidArgumentError(
            "With ref_includes_query=True, the first len(query) rows of 'reference' must equal "
            "'query' and the first len(query_labels) entries of 'reference_labels' must equal "
            "'query_labels'. Put the query first in the reference, or pass "
            "ref_includes_query=False."
        )


def _given_protocol_arguments(
    options: ProtocolOptions, roles: bool, single_shot: SingleShot | None
) -> list[str]:
    """The names of the protocol arguments a call gave (for a refusal to name them)."""
    given = options.given()
    if roles:
        given += ["is_query", "is_reference"]
    if single_shot is not None:
        given.append("single_gallery_shot")
        if single_shot.draws is not None:
            given.append("single_gallery_shot_draws")
    return given


def _check_one_set(
    reference: Any, reference_labels: Any, ref_includes_query: bool, reference_groups: Any
) -> None:
    """``is_query``/``is_reference`` split one set: no separate reference may be given."""
    given = [
        name
        for name, value in (
            ("reference", reference),
            ("reference_labels", reference_labels),
            ("reference_groups", reference_groups),
        )
        if value is not None
    ]
    if ref_includes_query:
        given.append("ref_includes_query")
    if given:
        raise InvalidArgumentError(
            "The 'is_query' and 'is_reference' parameters of AccuracyCalculator.get_accuracy "
            "split one set of embeddings ('query', with its labels and 'query_groups') into "
            f"both roles. Got {given} as well instead; pass one set only."
        )


def _protocol_inputs(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool],
    options: ProtocolOptions,
    flags: tuple[Any, Any] | None,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    ProtocolOptions,
    torch.Tensor | None,
    Roles | None,
]:
    """The query and reference of a protocol call, its checked options, each query's
    own reference row (``self_rows``, -1 for none; None when no query is a reference),
    and the rows of each role (None without ``is_query``/``is_reference``)."""
    query, query_labels, reference, reference_labels, ref_includes_query = inputs
    one_set = reference is query and ref_includes_query
    device = query.device
    query_groups, reference_groups = options.query_groups, options.reference_groups
    if one_set:
        if reference_groups is not None:
            raise InvalidArgumentError(
                "The 'reference_groups' parameter of AccuracyCalculator.get_accuracy must be "
                "None when the query is its own reference ('query_groups' covers both)."
            )
        reference_groups = query_groups
    elif (query_groups is None) != (reference_groups is None):
        missing, given = (
            ("reference_groups", "query_groups")
            if reference_groups is None
            else ("query_groups", "reference_groups")
        )
        raise invalid(
            missing,
            "AccuracyCalculator.get_accuracy",
            f"group ids when '{given}' is given (both or neither)",
            None,
        )
    if query_groups is not None:
        query_groups = check_groups(query_groups, "query_groups", len(query), device)
        reference_groups = check_groups(
            reference_groups, "reference_groups", len(reference), device
        )
    pairs = check_pairs(options.excluded_pairs, (len(query), len(reference)), device)
    self_rows = torch.arange(len(query), device=device) if ref_includes_query else None
    roles = None
    if flags is not None:
        roles = split_roles(flags[0], flags[1], len(query))
        position = torch.full((len(query),), -1, dtype=torch.long, device=device)
        position[roles.reference_rows] = torch.arange(len(roles.reference_rows), device=device)
        self_rows = position[roles.query_rows]
        if pairs is not None:
            pairs = _pairs_in_roles(pairs, roles.query_rows, position)
        rows = (query, query_labels)
        query, query_labels = (t[roles.query_rows] for t in rows)
        reference, reference_labels = (t[roles.reference_rows] for t in rows)
        if query_groups is not None:
            query_groups, reference_groups = (
                query_groups[roles.query_rows],
                query_groups[roles.reference_rows],
            )
    checked = ProtocolOptions(
        query_groups, reference_groups, options.junk_labels, options.distractor_labels, pairs
    )
    return query, query_labels, reference, reference_labels, checked, self_rows, roles


def _pairs_in_roles(
    pairs: torch.Tensor, query_rows: torch.Tensor, reference_position: torch.Tensor
) -> torch.Tensor:
    """Pairs of rows of one set as pairs of (query index, reference index); pairs whose
    rows do not have those roles are dropped."""
    query_position = torch.full_like(reference_position, -1)
    query_position[query_rows] = torch.arange(len(query_rows), device=query_rows.device)
    mapped = torch.stack([query_position[pairs[:, 0]], reference_position[pairs[:, 1]]], dim=1)
    return mapped[(mapped >= 0).all(dim=1)]
