"""Confidence intervals and paired comparisons of retrieval metrics by bootstrap.

A metric averaged over a test set is an estimate: another test set of the same size would
give another number. The percentile bootstrap resamples the queries (or, since queries of
one class are not independent, whole classes) with replacement, recomputes the average
each time, and reads the interval off the quantiles of those averages. A paired bootstrap
resamples the same queries for two models, so that what the queries have in common (some
are hard for every model) cancels out of their difference.

A resample's average depends only on how many times it draws each query. When the values
take few distinct levels (Recall@K and precision@1 are 0 or 1, precision@K has K + 1
levels), the counts of each level are drawn directly from their multinomial distribution,
one binomial per level for all resamples at once: exact, and independent of the number of
queries. Other values are resampled as chunks of index matrices with one gather per chunk.
Each metric is resampled on its own (``benchmarks/bootstrap.py`` measures both paths).

Near 0 and 1 the percentile bootstrap covers far less than it promises (about 24% at
n = 30 and 63% at n = 100 for a true rate of 0.99): it cannot see outside the sample. So
``method="auto"`` (the default) gives a metric whose per-query values are 0 or 1 by its
definition (Recall@K, precision@1; not one whose values merely happen to be) the
Clopper-Pearson interval of a binomial proportion
(:mod:`.binomial`), which covers at least its level for every rate and every n, and keeps
the percentile bootstrap for the others and whenever whole classes are resampled. Under
``single_gallery_shot`` a query's Recall@K and precision@1 are expectations over the
single-shot draws (any value in [0, 1]), not 0/1 outcomes: no binomial interval applies,
so ``"auto"`` bootstraps them and ``"clopper_pearson"`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._metric_catalog import zero_one_by_definition
from ..._validation import check_plain_tensor, invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ._per_query import PerQueryValues
from ._single_shot import single_shot_rank
from .binomial import clopper_pearson

__all__ = [
    "ConfidenceInterval",
    "PairedComparison",
    "bootstrap_interval",
    "bootstrap_intervals",
    "paired_bootstrap",
    "compare_per_query",
]

# Gathered elements per chunk of resamples (small chunks stay in cache: faster).
_CHUNK_ELEMENTS = 1 << 18
# With at most this many distinct values, resample value counts instead of queries ...
_MAX_LEVELS = 2048
# ... and only where it pays: a binomial draw costs about as much as this many gathers.
_ROWS_PER_LEVEL = 16
# The interval methods: "auto" chooses Clopper-Pearson for 0/1 values, else percentile.
METHODS = ("auto", "percentile", "clopper_pearson")


@dataclass(frozen=True)
class ConfidenceInterval:
    """A metric's average over the queries and its confidence interval.

    Attributes:
        estimate: The average over the queries (the reported metric).
        low: Lower end: for ``"percentile"``, the ``(1 - level) / 2`` quantile of the
            resampled averages; for ``"clopper_pearson"``, the exact binomial lower bound.
        high: Upper end, likewise.
        level: Nominal coverage, e.g. 0.95.
        method: How the interval was made: ``"percentile"`` or ``"clopper_pearson"``.
    """

    estimate: float
    low: float
    high: float
    level: float
    method: str = "percentile"

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.estimate,
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "method": self.method,
        }


@dataclass(frozen=True)
class PairedComparison:
    """Model B against model A on the same queries.

    Attributes:
        a, b: Each model's average over the queries.
        difference: ``b - a``.
        low, high: Percentile-bootstrap interval of the difference.
        p_value: One-sided p-value of "B is no better than A": the share of resampled
            differences at or below zero, ``(1 + count) / (1 + num_resamples)``. Small
            values say B's advantage is larger than the test set's noise.
        level: Nominal coverage of the interval.
    """

    a: float
    b: float
    difference: float
    low: float
    high: float
    p_value: float
    level: float

    def as_dict(self) -> dict[str, float]:
        return {
            "a": self.a,
            "b": self.b,
            "difference": self.difference,
            "low": self.low,
            "high": self.high,
            "p_value": self.p_value,
            "level": self.level,
        }


def bootstrap_interval(
    values: torch.Tensor,
    level: float = 0.95,
    num_resamples: int = 1000,
    seed: int = 0,
    groups: torch.Tensor | None = None,
    method: str = "auto",
    *,
    metric: str | None = None,
) -> ConfidenceInterval:
    """Confidence interval of the mean of per-query values.

    Args:
        values: One value per query (e.g. ``PerQueryValues.values["recall_at_1"]``).
        level: Nominal coverage in (0, 1).
        num_resamples: Bootstrap resamples.
        seed: Seed of the resampling; the same seed gives the same interval.
        groups: Optional group id per query (e.g. its class): whole groups are resampled,
            and each resample's average is over the queries of the groups drawn.
        method: ``"percentile"`` (bootstrap), ``"clopper_pearson"`` (exact binomial
            interval; values must be 0 or 1, without ``groups``) or ``"auto"``:
            Clopper-Pearson for a 0/1 metric without ``groups``, else percentile.
        metric: The metric the values are of. Given, ``"auto"`` goes by its definition:
            Clopper-Pearson only for ``recall_at_<K>`` and ``precision_at_1`` (a metric
            such as ``mean_average_precision`` whose values are all 0 or 1 on easy data is
            still bootstrapped). Left out, the values are of no known metric and every
            value being 0 or 1 makes them a binomial sample.

    Example:
        >>> values = torch.tensor([1.0, 0.0, 1.0, 1.0] * 50)
        >>> interval = bootstrap_interval(values, seed=0)
        >>> interval.estimate, interval.low < 0.75 < interval.high, interval.method
        (0.75, True, 'clopper_pearson')
    """
    owner = "bootstrap_interval"
    matrix = _values_matrix({"values": values}, owner)
    _check_options(level, num_resamples, seed, owner)
    group_ids = _group_ids(groups, len(matrix), owner)
    if metric is not None and not isinstance(metric, str):
        raise invalid("metric", owner, "None or a metric name", metric, InvalidTypeError)
    name = "values" if metric is None else metric
    chosen = _methods(
        matrix, method, group_ids is not None, owner, [name], definitions=metric is not None
    )[0]
    if chosen == "clopper_pearson":
        return _binomial_interval(matrix[:, 0], level)
    means = _resampled_means(matrix, group_ids, num_resamples, seed)
    return _interval(float(matrix[:, 0].mean()), means[:, 0], level)


def bootstrap_intervals(
    per_query: PerQueryValues,
    level: float = 0.95,
    num_resamples: int = 1000,
    seed: int = 0,
    by_class: bool = False,
    method: str = "auto",
) -> dict[str, ConfidenceInterval]:
    """Intervals for every metric of ``get_accuracy(..., return_per_query=True)["per_query"]``.

    ``by_class=True`` resamples whole classes instead of queries. ``method`` is as for
    :func:`bootstrap_interval`, chosen per metric with ``"auto"`` by the metric's
    definition: Recall@K and precision@1 (0 or 1 per query by definition) get
    Clopper-Pearson, the others the percentile bootstrap, even where their values happen to
    be all 0 or 1 (``mean_average_precision`` on an easy test set).

    Example:
        >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
        >>> x, y = torch.randn(300, 8), torch.arange(300) % 10
        >>> x[:, 0] += 3 * y  # classes lie apart along one axis
        >>> calc = AccuracyCalculator(include=("recall_at_1", "recall_at_4"))
        >>> per_query = calc.get_accuracy(x, y, return_per_query=True)["per_query"]
        >>> intervals = bootstrap_intervals(per_query, seed=0)
        >>> sorted(intervals), intervals["recall_at_1"].low <= intervals["recall_at_1"].high
        (['recall_at_1', 'recall_at_4'], True)
    """
    owner = "bootstrap_intervals"
    _check_options(level, num_resamples, seed, owner)
    matrix = _values_matrix(_per_query_values(per_query, owner), owner)
    groups = _class_groups(per_query) if by_class else None
    names = list(per_query.values)
    chosen = _methods(matrix, method, by_class, owner, names, _expected(per_query))
    means = _resampled_means(matrix, groups, num_resamples, seed)
    estimates = matrix.mean(dim=0) if len(matrix) else torch.full((matrix.shape[1],), torch.nan)
    return {
        name: _binomial_interval(matrix[:, col], level)
        if chosen[col] == "clopper_pearson"
        else _interval(float(estimates[col]), means[:, col], level)
        for col, name in enumerate(per_query.values)
    }


def paired_bootstrap(
    values_a: torch.Tensor,
    values_b: torch.Tensor,
    level: float = 0.95,
    num_resamples: int = 1000,
    seed: int = 0,
    groups: torch.Tensor | None = None,
) -> PairedComparison:
    """Paired bootstrap of ``mean(values_b) - mean(values_a)`` over the same queries.

    Args:
        values_a: Per-query values of model A.
        values_b: Per-query values of model B for the same queries in the same order.
        level, num_resamples, seed, groups: As for :func:`bootstrap_interval`.

    Example:
        >>> a = torch.tensor([1.0, 0.0, 1.0, 0.0] * 100)
        >>> b = torch.tensor([1.0, 1.0, 1.0, 0.0] * 100)
        >>> result = paired_bootstrap(a, b, seed=0)
        >>> result.difference, result.p_value < 0.01
        (0.25, True)
    """
    owner = "paired_bootstrap"
    matrix = _values_matrix({"values_a": values_a, "values_b": values_b}, owner)
    _check_options(level, num_resamples, seed, owner)
    groups_ids = _group_ids(groups, len(matrix), owner)
    return _compare(matrix[:, :1], matrix[:, 1:], groups_ids, level, num_resamples, seed)[0]


def compare_per_query(
    per_query_a: PerQueryValues,
    per_query_b: PerQueryValues,
    level: float = 0.95,
    num_resamples: int = 1000,
    seed: int = 0,
    by_class: bool = False,
) -> dict[str, PairedComparison]:
    """Paired comparison of every metric both per-query results have (same queries).

    Example:
        >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
        >>> y = torch.arange(400) % 8
        >>> good, bad = torch.randn(400, 4), torch.randn(400, 4)
        >>> good[:, 0] += 4 * y
        >>> calc = AccuracyCalculator(include=("recall_at_1",))
        >>> a = calc.get_accuracy(bad, y, return_per_query=True)["per_query"]
        >>> b = calc.get_accuracy(good, y, return_per_query=True)["per_query"]
        >>> compare_per_query(a, b, seed=0)["recall_at_1"].p_value < 0.01
        True
    """
    owner = "compare_per_query"
    _check_options(level, num_resamples, seed, owner)
    values_a = _per_query_values(per_query_a, owner)
    values_b = _per_query_values(per_query_b, owner)
    _check_same_queries(per_query_a, per_query_b, owner)
    names = _common_metrics(values_a, values_b, owner)
    matrix_a = _values_matrix({name: values_a[name] for name in names}, owner)
    matrix_b = _values_matrix({name: values_b[name] for name in names}, owner)
    groups = _class_groups(per_query_a) if by_class else None
    results = _compare(matrix_a, matrix_b, groups, level, num_resamples, seed)
    return dict(zip(names, results))


def _compare(
    matrix_a: torch.Tensor,
    matrix_b: torch.Tensor,
    groups: torch.Tensor | None,
    level: float,
    num_resamples: int,
    seed: int,
) -> list[PairedComparison]:
    """One comparison per column; the same resamples for A and B (and for every column)."""
    differences = _resampled_means(matrix_b - matrix_a, groups, num_resamples, seed)
    results = []
    for col in range(matrix_a.shape[1]):
        a, b = _mean(matrix_a[:, col]), _mean(matrix_b[:, col])
        interval = _interval(b - a, differences[:, col], level)
        at_or_below = int((differences[:, col] <= 0).sum())
        p_value = (1 + at_or_below) / (1 + num_resamples) if len(matrix_a) else float("nan")
        results.append(PairedComparison(a, b, b - a, interval.low, interval.high, p_value, level))
    return results


def _resampled_means(
    matrix: torch.Tensor, groups: torch.Tensor | None, num_resamples: int, seed: int
) -> torch.Tensor:
    """``(num_resamples, columns)`` averages of ``matrix``'s rows resampled with replacement."""
    values = matrix.numpy()
    if len(values) == 0:
        means = np.full((num_resamples, values.shape[1]), np.nan)
    elif groups is None:  # each column from the same seed: equal columns, equal intervals
        means = np.stack(
            [
                _column_resamples(column, num_resamples, np.random.default_rng(seed))
                for column in values.T
            ],
            axis=1,
        )
    else:
        means = _group_resamples(values, groups.numpy(), num_resamples, np.random.default_rng(seed))
    return torch.from_numpy(means.reshape(num_resamples, values.shape[1]))


def _column_resamples(
    values: np.ndarray, num_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    levels, counts = np.unique(values, return_counts=True)
    if len(levels) <= _MAX_LEVELS and len(levels) * _ROWS_PER_LEVEL <= len(values):
        return _level_resamples(levels, counts, num_resamples, rng)
    return _index_resamples(values, num_resamples, rng)


def _level_resamples(
    levels: np.ndarray, counts: np.ndarray, num_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Exact shortcut for few distinct values: a resample's mean depends only on how often
    it draws each value, a multinomial draw, sampled as one binomial per value."""
    num_rows = int(counts.sum())
    remaining = np.full(num_resamples, num_rows, dtype=np.int64)
    totals = np.zeros(num_resamples)
    left = num_rows
    for level, count in zip(levels[:-1].tolist(), counts[:-1].tolist()):
        drawn = rng.binomial(remaining, count / left)
        totals += drawn * level
        remaining -= drawn
        left -= count
    totals += remaining * float(levels[-1])
    return totals / num_rows


def _index_resamples(
    values: np.ndarray, num_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Draw row indices in chunks and average the gathered values."""
    num_rows = len(values)
    chunk = max(1, _CHUNK_ELEMENTS // num_rows)
    means = np.empty(num_resamples)
    for start in range(0, num_resamples, chunk):
        size = min(chunk, num_resamples - start)
        rows = rng.integers(0, num_rows, (size, num_rows), dtype=np.int64)  # no conversion
        means[start : start + size] = values.take(rows).mean(axis=1)
    return means


def _group_resamples(
    values: np.ndarray, groups: np.ndarray, num_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Resample whole groups; each average is (sum over drawn groups) / (their queries)."""
    num_groups = int(groups.max()) + 1
    sums = np.zeros((num_groups, values.shape[1]))
    np.add.at(sums, groups, values)
    counts = np.bincount(groups, minlength=num_groups).astype(np.float64)
    means = np.empty((num_resamples, values.shape[1]))
    chunk = max(1, _CHUNK_ELEMENTS // (num_groups * (values.shape[1] + 1)))
    for start in range(0, num_resamples, chunk):
        size = min(chunk, num_resamples - start)
        drawn = rng.integers(0, num_groups, (size, num_groups))
        means[start : start + size] = sums[drawn].sum(axis=1) / counts[drawn].sum(axis=1)[:, None]
    return means


def _interval(estimate: float, means: torch.Tensor, level: float) -> ConfidenceInterval:
    if bool(torch.isnan(means).any()):
        return ConfidenceInterval(estimate, float("nan"), float("nan"), level)
    tail = (1.0 - level) / 2.0
    quantiles = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
    low, high = torch.quantile(means, quantiles).tolist()
    return ConfidenceInterval(estimate, low, high, level)


def _expected(per_query: PerQueryValues) -> list[str]:
    """The metrics whose per-query values are single-shot expectations (in [0, 1]), not
    0/1 outcomes, even where a value happens to be 0 or 1."""
    if per_query.single_shot_cmc is None:
        return []
    return [name for name in per_query.values if single_shot_rank(name) is not None]


def _methods(
    matrix: torch.Tensor,
    method: Any,
    grouped: bool,
    owner: str,
    names: list[str],
    expected: Sequence[str] = (),
    definitions: bool = True,
) -> list[str]:
    """The interval method of each column (named by ``names``): ``method``, or what
    ``"auto"`` chooses. ``"auto"`` gives Clopper-Pearson only to metrics that are 0/1 by
    definition (:func:`zero_one_by_definition`; with ``definitions=False``, values of no
    known metric, to any all-0/1 column). The columns named in ``expected`` (single-shot
    expectations) are never binomial: ``"auto"`` bootstraps them and ``"clopper_pearson"``
    is refused."""
    if not isinstance(method, str) or method not in METHODS:
        raise invalid("method", owner, f"one of {list(METHODS)}", method)
    zero_one = [
        bool(((column == 0) | (column == 1)).all()) and name not in expected
        for name, column in zip(names, matrix.T)
    ]
    # "auto" goes by what a metric is, not by what its values happen to be on this data
    binomial_kind = [
        flag and (not definitions or zero_one_by_definition(name))
        for name, flag in zip(names, zero_one)
    ]
    if method == "clopper_pearson" and expected:
        raise InvalidArgumentError(
            f"The 'method' parameter of {owner} cannot be 'clopper_pearson' for the per-query "
            "values of get_accuracy(..., single_gallery_shot=True): "
            f"{', '.join(repr(name) for name in expected)} are expectations between 0 and 1 "
            "over the single-shot draws, not 0/1 outcomes, so a binomial interval does not "
            "apply. Use method='auto' or 'percentile' (the percentile bootstrap)."
        )
    if method == "clopper_pearson":
        if grouped:
            raise InvalidArgumentError(
                f"The 'method' parameter of {owner} cannot be 'clopper_pearson' when whole "
                "groups (classes) are resampled: the binomial interval assumes independent "
                "queries. Use method='percentile' or 'auto'."
            )
        other = [name for name, flag in zip(names, zero_one) if not flag]
        if other:
            raise InvalidArgumentError(
                f"The 'method' parameter of {owner} cannot be 'clopper_pearson': it needs "
                f"values that are all 0 or 1, and {', '.join(repr(name) for name in other)} "
                f"{'has' if len(other) == 1 else 'have'} others. Use method='auto' (Clopper-"
                "Pearson for the 0/1 metrics, percentile for the others) or 'percentile'."
            )
    if method != "auto":
        return [method] * matrix.shape[1]
    binomial = not grouped and len(matrix) > 0
    return ["clopper_pearson" if binomial and flag else "percentile" for flag in binomial_kind]


def _binomial_interval(values: torch.Tensor, level: float) -> ConfidenceInterval:
    successes, trials = int(values.sum()), len(values)
    low, high = clopper_pearson(successes, trials, level)
    estimate = successes / trials if trials else float("nan")
    return ConfidenceInterval(estimate, low, high, level, "clopper_pearson")


def _mean(values: torch.Tensor) -> float:
    return float(values.mean()) if len(values) else float("nan")


def _values_matrix(values: Mapping[str, Any], owner: str) -> torch.Tensor:
    """Per-query value vectors of one length as the columns of a float64 CPU matrix."""
    columns = []
    for param, vector in values.items():
        if not isinstance(vector, torch.Tensor):
            raise invalid(param, owner, "a torch.Tensor", type(vector).__name__, InvalidTypeError)
        check_plain_tensor(vector, param, owner)
        if vector.ndim != 1:
            raise invalid(param, owner, "a 1-D tensor of per-query values", tuple(vector.shape))
        if not bool(torch.isfinite(vector).all()):
            raise InvalidArgumentError(
                f"The '{param}' parameter of {owner} contains NaN or infinite values; "
                "per-query values must be finite."
            )
        columns.append(vector.detach().to("cpu", torch.float64))
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise InvalidArgumentError(
            f"The per-query values given to {owner} must all have one length (the same "
            f"queries). Got lengths {[len(column) for column in columns]} instead."
        )
    if not columns:
        return torch.zeros((0, 0), dtype=torch.float64)
    return torch.stack(columns, dim=1)


def _per_query_values(per_query: Any, owner: str) -> dict[str, torch.Tensor]:
    if not isinstance(per_query, PerQueryValues):
        raise invalid(
            "per_query",
            owner,
            "the PerQueryValues of get_accuracy(..., return_per_query=True)['per_query']",
            type(per_query).__name__,
            InvalidTypeError,
        )
    return per_query.values


def _check_same_queries(first: PerQueryValues, second: PerQueryValues, owner: str) -> None:
    same = first.query_indices.shape == second.query_indices.shape and bool(
        torch.equal(first.query_indices.cpu(), second.query_indices.cpu())
    )
    if not same:
        raise InvalidArgumentError(
            f"The two per-query results given to {owner} must score the same queries "
            f"(same query labels, same reference labels). Got {len(first)} and "
            f"{len(second)} scored queries at different indices instead."
        )
    labels = (first.query_labels.cpu(), second.query_labels.cpu())
    if labels[0].shape != labels[1].shape or not bool(torch.equal(*labels)):
        differ = int((labels[0] != labels[1]).reshape(len(labels[0]), -1).any(1).sum())
        raise InvalidArgumentError(
            f"The two per-query results given to {owner} must be computed with the same "
            f"labels: a paired comparison scores the same queries against the same classes. "
            f"Got different labels for {differ} of {len(first)} scored queries instead."
        )


def _common_metrics(
    values_a: Mapping[str, torch.Tensor], values_b: Mapping[str, torch.Tensor], owner: str
) -> list[str]:
    names = [name for name in values_a if name in values_b]
    if not names:
        raise InvalidArgumentError(
            f"The two per-query results given to {owner} have no metric in common, so there "
            f"is nothing to compare. Got {sorted(values_a)} and {sorted(values_b)} instead."
        )
    return names


def _class_groups(per_query: PerQueryValues) -> torch.Tensor:
    labels = per_query.query_labels.cpu()
    dim = 0 if labels.ndim > 1 else None
    return torch.unique(labels, return_inverse=True, dim=dim)[1]


def _group_ids(groups: Any, length: int, owner: str) -> torch.Tensor | None:
    if groups is None:
        return None
    check_plain_tensor(groups, "groups", owner)
    if not isinstance(groups, torch.Tensor) or groups.is_floating_point() or groups.ndim != 1:
        raise invalid("groups", owner, "None or a 1-D integer tensor", groups, InvalidTypeError)
    if len(groups) != length:
        raise invalid("groups", owner, f"one group id per value ({length})", len(groups))
    return torch.unique(groups.cpu(), return_inverse=True)[1]


def _check_options(level: Any, num_resamples: Any, seed: Any, owner: str) -> None:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise invalid("level", owner, "a float strictly between 0 and 1 (e.g. 0.95)", level)
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise invalid("num_resamples", owner, "a positive int", num_resamples)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise invalid("seed", owner, "an int", seed, InvalidTypeError)
    if seed < 0:
        raise invalid("seed", owner, "a non-negative int (NumPy's generators take no other)", seed)
