"""AccuracyCalculator for embeddings sharded across the ranks of a ``torch.distributed`` group."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Callable, cast

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError
from ..clustering.mutual_information import adjusted_mutual_info, normalized_mutual_info
from ..retrieval import metrics
from ..retrieval._label_stats import LabelComparison
from ..retrieval._metric_names import parse_metric_name, per_query_function
from ..retrieval.accuracy_calculator import AccuracyCalculator, MetricValue
from ._collectives import (
    Comm,
    agree,
    all_gather_ints,
    all_reduce_sum,
    resolve_comm,
    resolve_timeout,
)
from ._labels import counts_of, global_label_counts, index_in
from ._layout import ShardLayout
from ._protocol import ShardProtocol, check_protocol_options, shard_protocol
from .kmeans import DistributedKMeans
from .knn import _LABEL_DTYPES, DistributedKNN

logger = logging.getLogger(__name__)

__all__ = ["DistributedAccuracyCalculator"]

_GET_ACCURACY = inspect.signature(AccuracyCalculator.get_accuracy)
_OWNER = "DistributedAccuracyCalculator"
_CLUSTERING = ("NMI", "AMI")
# Relevance elements one metric processes at once (bounds float64 temporaries).
_METRIC_BLOCK = 1 << 22
# Elements of one (distinct query labels, distinct reference labels) comparison block.
_COMPARE_BLOCK = 1 << 24


@dataclass
class _Shards:
    """This rank's validated inputs and the label facts every rank agrees on."""

    query: torch.Tensor
    query_labels: torch.Tensor
    reference: torch.Tensor
    reference_labels: torch.Tensor
    ref_includes_query: bool
    num_reference: int  # rows of the global reference
    query_classes: torch.Tensor  # distinct query labels of all ranks, sorted
    query_class: torch.Tensor  # each local query's index into query_classes
    layout: ShardLayout | None = None
    protocol: ShardProtocol | None = None


class DistributedAccuracyCalculator(AccuracyCalculator):
    """AccuracyCalculator where every rank passes its own shard and gets the global metrics.

    Every rank of the group calls :meth:`get_accuracy` with its shard of the query, the
    reference and their labels, and every rank returns the same dictionary as
    :class:`~pytorch_metric_learning.evaluation.AccuracyCalculator` given the shards
    concatenated in rank order. With ``ref_includes_query``, each rank's query shard must
    be the first rows of its reference shard (see :class:`DistributedKNN` for the global
    reference this describes).

    How the work is shared: the label statistics are reduced as tables of distinct labels
    with their counts (global class counts, so lone queries are those whose label no other
    rank's reference has either), the neighbours' labels travel with the k-NN results, each
    metric is computed for the queries where they live, and every average is taken from
    sums and counts reduced across ranks (per label first for ``avg_of_avgs`` and
    ``return_per_class``). NMI and AMI cluster all queries with
    :class:`DistributedKMeans` and reduce the contingency table of labels and clusters.

    Takes the arguments of AccuracyCalculator, and:

    Args:
        knn_func: A :class:`DistributedKNN`, or the local exact backend (any spec) that a
            DistributedKNN runs on each rank's shard. Default: squared Euclidean CustomKNN.
        kmeans_func: A :class:`DistributedKMeans` (or a spec that builds one); ``None``
            builds one with ``group`` and ``timeout``.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective; ``None`` uses the
            group's timeout.

    Only the built-in metrics are computed across ranks: a subclass that adds or replaces
    a ``calculate_<name>`` method raises ``ValueError``.

    Example:
        >>> import os, tempfile
        >>> import torch.distributed as dist
        >>> path = os.path.join(tempfile.mkdtemp(), "init")
        >>> dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
        >>> query = torch.tensor([[0.0], [0.1], [1.0], [1.2], [5.0]])
        >>> labels = torch.tensor([0, 0, 1, 1, 2])
        >>> calc = DistributedAccuracyCalculator(include=("precision_at_1", "r_precision"))
        >>> calc.get_accuracy(query, labels)
        {'precision_at_1': 1.0, 'r_precision': 1.0}
        >>> dist.destroy_process_group()
    """

    def __init__(
        self,
        *args: Any,
        group: Any = None,
        timeout: float | timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        """Takes :class:`AccuracyCalculator`'s arguments, plus ``group`` and ``timeout``."""
        super().__init__(*args, **kwargs)
        given = inspect.signature(AccuracyCalculator).bind(*args, **kwargs).arguments
        kmeans_func = given.get("kmeans_func")
        self.group = group
        self.timeout = resolve_timeout(timeout, _OWNER)
        self._check_builtin(self.get_curr_metrics())
        if not isinstance(self.knn_func, DistributedKNN):
            self.knn_func = DistributedKNN(self.knn_func, group=group, timeout=self.timeout)
        if kmeans_func is None:
            self.kmeans_func = DistributedKMeans(group=group, timeout=self.timeout)
        elif not isinstance(self.kmeans_func, DistributedKMeans):
            raise invalid(
                "kmeans_func", _OWNER, "None or a DistributedKMeans (backend 'torch_distributed')",
                kmeans_func,
            )  # fmt: skip

    def _check_builtin(self, names: Sequence[str]) -> None:
        custom = [
            name
            for name in names
            if parse_metric_name(name) is None
            and getattr(type(self), self.function_keyword + name, None)
            is not getattr(AccuracyCalculator, self.function_keyword + name, object())
        ]
        if custom:
            raise InvalidArgumentError(
                f"{_OWNER} computes only the built-in metrics across ranks. Got the custom "
                f"metrics {custom} instead; compute them from gathered outputs yourself."
            )

    def get_accuracy(self, *args: Any, **kwargs: Any) -> dict[str, MetricValue]:
        """The selected metrics of every rank's shards together, the same on every rank.

        Every rank of the group must call it, with the same ``include``, ``exclude`` and
        ``ref_includes_query`` (and ``reference`` given on all ranks or on none). The
        arguments are those of :meth:`AccuracyCalculator.get_accuracy`, for this rank's
        shard; a shard may be empty. ``return_per_query=True`` and ``query_categories`` are
        not supported across ranks: gather the embeddings and use :class:`AccuracyCalculator`.

        The protocol options ``query_groups``, ``reference_groups``, ``junk_labels``,
        ``distractor_labels`` and ``excluded_pairs`` mean what they mean for
        AccuracyCalculator, for this rank's rows (1-D labels only): groups are one id per
        local query and reference row (``query_groups`` alone when ``reference`` is None);
        junk and distractor labels must be the same on every rank; ``excluded_pairs`` are
        ``(global query, global reference)`` row numbers as :class:`DistributedKNN`
        numbers them (the union of every rank's pairs is excluded). ``is_query`` and
        ``is_reference`` are refused: they split one set whose rows would move between
        ranks (see docs/distributed.md). The number of queries left out (no valid relevant
        reference) over all ranks is kept in ``last_num_queries_left_out``.
        """
        call = _GET_ACCURACY.bind(self, *args, **kwargs)  # the arguments of the base class
        call.apply_defaults()
        arg = SimpleNamespace(**call.arguments)
        query, reference = arg.query, arg.reference
        if arg.return_per_query:
            raise InvalidArgumentError(
                f"{_OWNER}.get_accuracy does not return per-query values (return_per_query="
                "True); gather the embeddings on one rank and use AccuracyCalculator."
            )
        if arg.query_categories is not None or arg.return_per_category:
            raise InvalidArgumentError(
                f"{_OWNER}.get_accuracy does not break metrics down by category "
                "(query_categories); gather the embeddings on one rank and use "
                "AccuracyCalculator."
            )
        _refuse_protocol({"is_query": arg.is_query, "is_reference": arg.is_reference})
        _refuse_single_shot(arg.single_gallery_shot, arg.single_gallery_shot_draws)
        options = check_protocol_options(
            arg.query_groups,
            arg.reference_groups,
            arg.junk_labels,
            arg.distractor_labels,
            arg.excluded_pairs,
        )
        if options.active:
            self.check_protocol_allowed(options.given())
        functions = self._functions_for_call(arg.include, arg.exclude)
        self._check_builtin(list(functions))
        comm = resolve_comm(self.group, self.timeout, _device_of(query, self.device))
        shards = self._shards(comm, query, arg.query_labels, reference, arg.reference_labels,
                              arg.ref_includes_query, options, reference is None)  # fmt: skip
        results: dict[str, MetricValue] = {}
        with torch.no_grad():
            knn_names = [name for name in functions if per_query_function(name) is not None]
            if knn_names:
                results.update(self._knn_metrics(comm, shards, knn_names))
            if any(name in _CLUSTERING for name in functions):
                results.update(self._clustering_metrics(comm, shards))
        return {name: results[name] for name in functions}

    get_accuracy.__signature__ = _GET_ACCURACY  # type: ignore[attr-defined]

    # ----- inputs and label statistics -----

    def _shards(
        self,
        comm: Comm,
        query: Any,
        query_labels: Any,
        reference: Any,
        reference_labels: Any,
        ref_includes_query: Any,
        options: Any = None,
        one_set: bool = False,
    ) -> _Shards:
        """Validate this rank's inputs, agree with the other ranks, build the class table."""
        error, meta, inputs = None, [0] * 8, None
        try:
            inputs = self._inputs(
                query, query_labels, reference, reference_labels, ref_includes_query
            )
            meta = _meta(*inputs) + [int(options is not None and options.active)]
        except Exception as exc:
            error = exc
        table = agree(comm, error, f"checking the inputs of {_OWNER}", meta)
        _check_same_everywhere(table)
        assert inputs is not None
        query, query_labels, reference, reference_labels, ref_includes_query = inputs
        classes, _ = global_label_counts(comm, query_labels, "counting the query labels")
        layout = ShardLayout(
            tuple(table[:, 0].tolist()), tuple(table[:, 1].tolist()), ref_includes_query
        )
        shards = _Shards(
            query, query_labels, reference, reference_labels, ref_includes_query,
            int(table[:, 1].sum()), classes, index_in(classes, query_labels), layout,
        )  # fmt: skip
        if bool(table[:, 7].any()):  # a rank may have pairs where another has none
            shards.protocol = shard_protocol(comm, shards, options, one_set)
        return shards

    def _num_relevant(self, comm: Comm, shards: _Shards) -> torch.Tensor:
        """``R`` of every local query: matching reference rows on all ranks, minus itself
        (under a protocol: its valid relevant references)."""
        if shards.protocol is not None:
            return shards.protocol.num_relevant
        unique, counts = global_label_counts(
            comm, shards.reference_labels, "counting the reference labels"
        )
        comparison = self._custom_comparison
        if comparison is None:
            matches = counts_of(unique, counts, shards.query_labels)
            return matches - int(shards.ref_includes_query)
        return _custom_relevant(
            comparison, unique, counts, shards.query_labels, shards.ref_includes_query
        )

    # ----- k-NN metrics -----

    def _knn_metrics(self, comm: Comm, shards: _Shards, names: list[str]) -> dict[str, MetricValue]:
        num_relevant = self._num_relevant(comm, shards)
        keep = num_relevant > 0
        local_max = int(num_relevant.max()) if num_relevant.numel() else 0
        flags = all_gather_ints(
            comm, [int(keep.any()), local_max, int((~keep).sum())], "sharing the label counts"
        )
        self.last_num_queries_left_out = int(flags[:, 2].sum())
        num_classes = len(shards.query_classes)
        if not bool(flags[:, 0].any()):
            logger.warning(  # logged, as by AccuracyCalculator and 2.x
                "None of the query labels are in the reference set: the k-NN metrics are NaN."
            )
            nan: MetricValue = [math.nan] * num_classes if self.return_per_class else math.nan
            return {name: nan for name in names}
        view = SimpleNamespace(max_bin_count=int(flags[:, 1].max()), not_lone=torch.tensor([True]))
        available = shards.num_reference - int(shards.ref_includes_query)
        k = self._neighbours_needed(names, cast(Any, view), available)
        relevance = self._relevance(shards, k)[keep]
        sums = self._reduced_sums(
            comm, names, relevance, num_relevant[keep], shards.query_class[keep], num_classes
        )
        return {name: self._average(row, num_classes) for name, row in zip(names, sums)}

    def _relevance(self, shards: _Shards, k: int) -> torch.Tensor:
        """Boolean ``(local queries, k)``: whether each neighbour matches its query."""
        knn = cast(DistributedKNN, self.knn_func)
        protocol = shards.protocol
        _, indices, knn_labels = knn.search_with_labels(
            shards.query, k, shards.reference, shards.reference_labels, shards.ref_includes_query,
            exclusion=None if protocol is None else protocol.exclusion,
        )  # fmt: skip
        labels = shards.query_labels.unsqueeze(1)
        comparison = self._custom_comparison
        if protocol is not None:
            return protocol.relevance(knn_labels == labels, indices, knn_labels)
        if comparison is None:
            equal = knn_labels == labels
            return equal.flatten(2).all(dim=2) if equal.ndim > 2 else equal
        result = comparison(labels, knn_labels)
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != tuple(
            knn_labels.shape[:2]
        ):
            raise InvalidArgumentError(
                f"The 'label_comparison_fn' parameter of {_OWNER} must return one bool per "
                f"(query, neighbour) pair, shape {tuple(knn_labels.shape[:2])}."
            )
        return result.bool()

    def _reduced_sums(
        self,
        comm: Comm,
        names: list[str],
        relevance: torch.Tensor,
        num_relevant: torch.Tensor,
        query_class: torch.Tensor,
        num_classes: int,
    ) -> torch.Tensor:
        """Per metric: ``[sum, count]`` of its per-query values over all ranks, then the
        per-class sums and counts when averaging per class."""
        per_class = self.avg_of_avgs or self.return_per_class
        width = 2 + (2 * num_classes if per_class else 0)
        packed = torch.zeros((len(names), width), dtype=torch.float64, device=relevance.device)
        for row, name in enumerate(names):
            values = _per_query(cast(Any, per_query_function(name)), relevance, num_relevant)
            packed[row, 0], packed[row, 1] = values.sum(), len(values)
            if per_class:
                packed[row, 2 : 2 + num_classes].index_add_(0, query_class, values)
                packed[row, 2 + num_classes :] = torch.bincount(query_class, minlength=num_classes)
        return all_reduce_sum(comm, packed, "summing the k-NN metrics").cpu()

    def _average(self, row: torch.Tensor, num_classes: int) -> MetricValue:
        if not (self.avg_of_avgs or self.return_per_class):
            return float(row[0] / row[1])
        sums, counts = row[2 : 2 + num_classes], row[2 + num_classes :]
        present = counts > 0
        per_class = sums[present] / counts[present]
        return per_class.tolist() if self.return_per_class else metrics.average(per_class)

    # ----- clustering metrics -----

    def _clustering_metrics(self, comm: Comm, shards: _Shards) -> dict[str, float]:
        num_clusters = len(shards.query_classes)
        clusters = self.kmeans_func(shards.query, num_clusters)
        if clusters.shape != (len(shards.query),) or clusters.is_floating_point():
            raise InvalidArgumentError(
                f"The kmeans_func of {_OWNER} must return {len(shards.query)} integer cluster "
                f"ids. Got {clusters.dtype} of shape {tuple(clusters.shape)} instead."
            )
        keys = shards.query_class * num_clusters + clusters.to(shards.query_class.device).long()
        cells, counts = global_label_counts(comm, keys, "reducing the contingency table")
        true = (cells // num_clusters).repeat_interleave(counts)
        predicted = (cells % num_clusters).repeat_interleave(counts)
        return {
            "NMI": normalized_mutual_info(true, predicted),
            "AMI": adjusted_mutual_info(true, predicted),
        }


def _device_of(query: Any, device: torch.device | None) -> torch.device:
    if device is not None:
        return device
    return query.device if isinstance(query, torch.Tensor) else torch.device("cpu")


def _meta(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    reference: torch.Tensor,
    reference_labels: torch.Tensor,
    ref_includes_query: bool,
) -> list[int]:
    """``[queries, references, dims, ref_includes_query, label ndim, label size, dtype]``."""
    if query_labels.dtype not in _LABEL_DTYPES or reference_labels.dtype != query_labels.dtype:
        raise invalid(
            "query_labels", f"{_OWNER}.get_accuracy",
            f"labels of one dtype among {list(_LABEL_DTYPES)} for query and reference",
            (query_labels.dtype, reference_labels.dtype),
        )  # fmt: skip
    return [
        len(query), len(reference), query.shape[1], int(ref_includes_query),
        query_labels.ndim, math.prod(query_labels.shape[1:]),
        _LABEL_DTYPES.index(query_labels.dtype),
    ]  # fmt: skip


def _check_same_everywhere(table: torch.Tensor) -> None:
    names = {
        2: "number of columns of the embeddings",
        3: "ref_includes_query (or whether 'reference' is given)",
        4: "number of label dimensions",
        5: "label row size",
        6: "label dtype",
    }
    for column, name in names.items():
        values = table[:, column].tolist()
        if len(set(values)) > 1:
            raise InvalidArgumentError(
                f"The {name} of {_OWNER}.get_accuracy must be the same on every rank. "
                f"Got {values} (by rank) instead."
            )


def _custom_relevant(
    comparison: LabelComparison,
    unique: torch.Tensor,
    counts: torch.Tensor,
    labels: torch.Tensor,
    ref_includes_query: bool,
) -> torch.Tensor:
    """``R`` per query under a custom comparison, from the global table of reference labels."""
    dim = 0 if labels.ndim > 1 else None
    distinct, inverse = torch.unique(labels, return_inverse=True, dim=dim)
    matches = torch.zeros(len(distinct), dtype=torch.long, device=labels.device)
    rows = max(1, _COMPARE_BLOCK // max(1, len(unique)))
    for start in range(0, len(distinct), rows):
        block = distinct[start : start + rows]
        hits = _compare(
            comparison, block.unsqueeze(1), unique.unsqueeze(0), (len(block), len(unique))
        )
        matches[start : start + rows] = (hits.long() * counts).sum(dim=1)
    if ref_includes_query:
        matches -= _compare(comparison, distinct, distinct, (len(distinct),)).long()
    return matches[inverse]


def _compare(
    comparison: LabelComparison, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    result = comparison(a, b)
    if not isinstance(result, torch.Tensor) or tuple(result.shape) != shape:
        raise InvalidArgumentError(
            f"The 'label_comparison_fn' parameter of {_OWNER} must return a tensor of shape "
            f"{shape} for labels of shapes {tuple(a.shape)} and {tuple(b.shape)}."
        )
    return result.bool()


def _per_query(
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    relevance: torch.Tensor,
    num_relevant: torch.Tensor,
) -> torch.Tensor:
    """One metric's float64 values for the (non-lone) queries, in row blocks."""
    if len(relevance) == 0:
        return torch.zeros(0, dtype=torch.float64, device=relevance.device)
    rows = max(1, _METRIC_BLOCK // max(1, relevance.shape[1]))
    return torch.cat(
        [
            metric(relevance[start : start + rows], num_relevant[start : start + rows])
            for start in range(0, len(relevance), rows)
        ]
    )


_PROTOCOL_OPTIONS = ("is_query", "is_reference")


def _refuse_single_shot(single_gallery_shot: Any, draws: Any) -> None:
    """The single-shot CMC needs every candidate of a query ranked in one place (and the
    random draws one random state): refuse it by name rather than ignore it."""
    given = [
        name
        for name, value, default in (
            ("single_gallery_shot", single_gallery_shot, False),
            ("single_gallery_shot_draws", draws, None),
        )
        if value is not default
    ]
    if given:
        raise InvalidArgumentError(
            f"{_OWNER}.get_accuracy does not compute the single-gallery-shot CMC ({given}) "
            "across ranks: it ranks every candidate of each query (and draws from one random "
            "state). Gather the embeddings on one rank and use AccuracyCalculator."
        )


def _refuse_protocol(options: dict[str, Any]) -> None:
    """The roles of one set (``is_query``/``is_reference``) are not computed across ranks:
    a row's roles would move it between the query and the reference numbering of the
    shards. Refuse them by name rather than ignore them."""
    unknown = sorted(set(options) - set(_PROTOCOL_OPTIONS))
    if unknown:
        raise TypeError(f"{_OWNER}.get_accuracy got unexpected keyword arguments {unknown}")
    given = sorted(
        name
        for name, value in options.items()
        if value is not None and (not isinstance(value, (tuple, list)) or len(value))
    )
    if given:
        raise InvalidArgumentError(
            f"{_OWNER}.get_accuracy does not apply {given} across ranks: they split one set "
            "into queries and references, which sharding cannot renumber. Pass each rank's "
            "query and reference shards with 'query_groups'/'reference_groups' and "
            "'excluded_pairs' instead (docs/distributed.md), or gather the embeddings on one "
            "rank and use AccuracyCalculator."
        )
