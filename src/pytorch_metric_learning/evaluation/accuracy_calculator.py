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

from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from .._validation import check_embeddings, check_same_device, invalid
from .._warnings import warn_external
from ..distances import LpDistance
from ..errors import InvalidArgumentError, InvalidTypeError
from . import metrics
from ._label_stats import LabelComparison, LabelStats, label_stats, relevance_of
from .kmeans import TorchKMeans
from .knn import CustomKNN
from .mutual_information import adjusted_mutual_info, normalized_mutual_info
from .registry import Spec, load_kmeans_func, load_knn_func

__all__ = ["AccuracyCalculator", "EQUALITY", "DEFAULT_METRICS", "ON_REQUEST_METRICS"]

OWNER = "AccuracyCalculator"
EQUALITY = torch.eq
# Computed when include=() ...
DEFAULT_METRICS = (
    "AMI",
    "NMI",
    "mean_average_precision_at_r",
    "precision_at_1",
    "r_precision",
)
# ... and these only when asked for.
ON_REQUEST_METRICS = ("mean_average_precision", "mean_reciprocal_rank")
_R_METRICS = frozenset({"r_precision", "mean_average_precision_at_r"})
_ONE_NEIGHBOUR_METRICS = frozenset({"precision_at_1"})
# Relevance elements processed at once by a metric (bounds float64 temporaries).
_METRIC_BLOCK = 1 << 22

MetricValue = Any  # a float, or a list of floats with return_per_class


class _UnsupportedCombinationError(InvalidArgumentError, NotImplementedError):
    """Options that cannot be used together (a ValueError; NotImplementedError as in 2.x)."""


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
    - ``NMI``, ``AMI``: normalized and adjusted mutual information (arithmetic
      normalization, as scikit-learn) between the query labels and a k-means clustering
      of the query embeddings with one cluster per distinct query label.

    Queries whose label has ``R = 0`` ("lone" queries) are left out of every k-NN metric;
    when every query is lone those metrics are NaN, with a warning. Values are averaged
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
            that many; R-precision and MAP@R are wrong (with a warning) when it is below
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
    ) -> None:
        self._all_functions = self._discover_functions()
        self.check_primary_metrics(include, exclude)
        self.original_function_dict = self.get_function_dict(include, exclude)
        self.curr_function_dict = dict(self.original_function_dict)
        if avg_of_avgs and return_per_class:
            raise InvalidArgumentError(
                "The 'avg_of_avgs' and 'return_per_class' parameters of AccuracyCalculator "
                "are mutually exclusive. Got both True instead."
            )
        self.avg_of_avgs = bool(avg_of_avgs)
        self.return_per_class = bool(return_per_class)
        self.k = _check_k(k)
        self.label_comparison_fn = self._check_comparison(label_comparison_fn)
        self.device = None if device is None else torch.device(device)
        self.knn_func = _default_knn() if knn_func is None else load_knn_func(knn_func)
        self.kmeans_func = TorchKMeans() if kmeans_func is None else load_kmeans_func(kmeans_func)

    def __repr__(self) -> str:
        return (
            f"AccuracyCalculator(include={tuple(self.get_curr_metrics())}, k={self.k!r}, "
            f"avg_of_avgs={self.avg_of_avgs}, return_per_class={self.return_per_class}, "
            f"knn_func={self.knn_func!r}, kmeans_func={self.kmeans_func!r})"
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
            unknown = [name for name in names if name not in self._all_functions]
            if unknown:
                raise invalid(param, OWNER, f"a tuple of names among {known}", tuple(names))

    def get_function_dict(
        self, include: Sequence[str] = (), exclude: Sequence[str] = ()
    ) -> dict[str, Callable[..., MetricValue]]:
        """The metrics selected by ``include`` and ``exclude``, by name."""
        if len(include) == 0:
            include = [name for name in self._all_functions if name not in ON_REQUEST_METRICS]
        return {
            name: function
            for name, function in self._all_functions.items()
            if name in include and name not in exclude
        }

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
            "r_precision",
        ]

    def description(self) -> str:
        return "avg_of_avgs" if self.avg_of_avgs else ""

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

        Returns:
            ``{metric name: float}`` (lists of per-label floats for k-NN metrics with
            ``return_per_class``).

        Raises:
            ValueError: for NaN or infinite embeddings, mismatched lengths, a reference
                that does not start with the query when ``ref_includes_query`` is set, or a
                k-NN backend whose output has the wrong shape or indices outside the
                reference.
        """
        query, query_labels, reference, reference_labels, ref_includes_query = self._inputs(
            query, query_labels, reference, reference_labels, ref_includes_query
        )
        functions = self._functions_for_call(include, exclude)
        kwargs: dict[str, Any] = {
            "query": query,
            "reference": reference,
            "query_labels": query_labels,
            "reference_labels": reference_labels,
            "ref_includes_query": ref_includes_query,
            "label_comparison_fn": self.label_comparison_fn,
        }
        if any(name in self.requires_knn() for name in functions):
            kwargs.update(self._knn_kwargs(functions, **kwargs))
        if any(name in self.requires_clustering() for name in functions):
            kwargs["cluster_labels"] = self._checked_cluster_labels(kwargs)
        with torch.no_grad():
            results = self._get_accuracy(functions, **kwargs)
        kwargs.clear()  # release the k-NN outputs before returning
        return results

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
        query = self._embeddings(query, "query")
        reference = self._embeddings(reference, "reference")
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
        if isinstance(tensor, torch.Tensor) and self.device is not None:
            tensor = tensor.to(self.device)
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
        value = value.to(embeddings.device)
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
        not_lone = stats.not_lone
        if not bool(not_lone.any()):
            warn_external(
                "None of the query labels are in the reference set: the k-NN metrics are NaN."
            )
        k = self._neighbours_needed(
            list(functions), stats, len(reference) - int(ref_includes_query)
        )
        distances, indices = self._search(query, k, reference, ref_includes_query)
        needs_labels = comparison is not None or any(
            not _is_builtin(type(self), name) for name in functions if name in self.requires_knn()
        )
        knn_labels = reference_labels[indices] if needs_labels else None
        relevance = relevance_of(stats, indices, query_labels, knn_labels, comparison)
        lone_classes = torch.zeros(stats.num_classes, dtype=torch.bool, device=not_lone.device)
        lone_classes[stats.query_class[~not_lone]] = True
        return {
            "label_counts": (stats.unique_query_labels, stats.match_counts),
            "lone_query_labels": stats.unique_query_labels[lone_classes],
            "not_lone_query_mask": not_lone,
            "knn_labels": knn_labels,
            "knn_distances": distances,
            "knn_indices": indices,
            "relevance": relevance,
            "label_stats": stats,
        }

    def _neighbours_needed(self, names: list[str], stats: LabelStats, available: int) -> int:
        """The most neighbours any selected k-NN metric needs, clamped to the reference."""
        knn_names = [name for name in names if name in self.requires_knn()]
        builtin = [name for name in knn_names if _is_builtin(type(self), name)]
        needs = (
            [self._k_neighbours(stats.max_bin_count, available)]
            if len(builtin) < len(knn_names)
            else []
        )
        if bool(stats.not_lone.any()):  # else every built-in metric is NaN without searching
            if any(name in _ONE_NEIGHBOUR_METRICS for name in builtin):
                needs.append(1)
            r_names = [name for name in builtin if name in _R_METRICS]
            if r_names:
                needs.append(self._r_neighbours(stats.max_bin_count, r_names))
            if any(name not in _ONE_NEIGHBOUR_METRICS | _R_METRICS for name in builtin):
                needs.append(self._k_neighbours(stats.max_bin_count, available))
        return min(max(needs, default=0), max(available, 0))

    def _r_neighbours(self, max_bin_count: int, names: list[str]) -> int:
        if isinstance(self.k, int) and self.k < max_bin_count:
            warn_external(
                f"AccuracyCalculator computes {names} with k={self.k}, below the largest "
                f"number of relevant references ({max_bin_count}), so their values are wrong. "
                "Use k='max_bin_count' (or k=None). For MAP@k use 'mean_average_precision'."
            )
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
        """Call the backend once (or not at all for k=0) and validate its output."""
        if k == 0:
            empty = torch.empty((len(query), 0), device=query.device)
            return empty, empty.long()
        with torch.no_grad():
            result = self.knn_func(query, k, reference, ref_includes_query)
        return _check_knn_output(result, len(query), k, len(reference), query.device)

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

    def calculate_precision_at_1(
        self, relevance: torch.Tensor, label_stats: LabelStats, **kwargs: Any
    ) -> MetricValue:
        return self._knn_metric(lambda rel, _: metrics.precision_at_1(rel), relevance, label_stats)

    def calculate_r_precision(
        self, relevance: torch.Tensor, label_stats: LabelStats, **kwargs: Any
    ) -> MetricValue:
        return self._knn_metric(metrics.r_precision, relevance, label_stats)

    def calculate_mean_average_precision_at_r(
        self, relevance: torch.Tensor, label_stats: LabelStats, **kwargs: Any
    ) -> MetricValue:
        return self._knn_metric(metrics.mean_average_precision_at_r, relevance, label_stats)

    def calculate_mean_average_precision(
        self, relevance: torch.Tensor, label_stats: LabelStats, **kwargs: Any
    ) -> MetricValue:
        return self._knn_metric(metrics.mean_average_precision, relevance, label_stats)

    def calculate_mean_reciprocal_rank(
        self, relevance: torch.Tensor, label_stats: LabelStats, **kwargs: Any
    ) -> MetricValue:
        return self._knn_metric(
            lambda rel, _: metrics.mean_reciprocal_rank(rel), relevance, label_stats
        )

    def _knn_metric(
        self,
        metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        relevance: torch.Tensor,
        stats: LabelStats,
    ) -> MetricValue:
        """Apply a per-query metric to the non-lone queries and average as configured."""
        keep = stats.not_lone
        if not bool(keep.any()):
            return [float("nan")] * stats.num_classes if self.return_per_class else float("nan")
        relevance, num_relevant = relevance[keep], stats.num_relevant[keep]
        rows = max(1, _METRIC_BLOCK // max(1, relevance.shape[1]))
        values = torch.cat(
            [
                metric(relevance[start : start + rows], num_relevant[start : start + rows])
                for start in range(0, len(relevance), rows)
            ]
        )
        if not (self.avg_of_avgs or self.return_per_class):
            return metrics.average(values)
        per_class = metrics.average_per_class(values, stats.query_class[keep], stats.num_classes)
        if self.return_per_class:
            return per_class.tolist()
        return metrics.average(per_class)


def _default_knn() -> CustomKNN:
    return CustomKNN(LpDistance(normalize_embeddings=False, power=2))


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


def _check_knn_output(
    result: Any, num_queries: int, k: int, num_reference: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    expected = (num_queries, k)
    if (
        not isinstance(result, (tuple, list))
        or len(result) != 2
        or not all(isinstance(part, torch.Tensor) for part in result)
    ):
        raise InvalidArgumentError(
            "The knn_func of AccuracyCalculator must return (distances, indices) tensors. "
            f"Got {type(result).__name__} instead."
        )
    distances, indices = result
    for name, part in (("distances", distances), ("indices", indices)):
        if tuple(part.shape) != expected:
            raise InvalidArgumentError(
                f"The knn_func of AccuracyCalculator must return {name} of shape {expected} "
                f"(len(query), k). Got {tuple(part.shape)} instead."
            )
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise InvalidArgumentError(
            f"The knn_func of AccuracyCalculator must return integer indices. Got {indices.dtype} instead."
        )
    indices = indices.to(device=device, dtype=torch.long)
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_reference):
        raise InvalidArgumentError(
            f"The knn_func of AccuracyCalculator returned indices outside the reference of "
            f"{num_reference} rows (range {int(indices.min())}..{int(indices.max())})."
        )
    return distances.to(device), indices
