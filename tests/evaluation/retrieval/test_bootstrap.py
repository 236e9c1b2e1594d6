"""Bootstrap intervals and paired comparisons, checked by simulation with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pytorch_metric_learning.errors import InvalidTypeError
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    ConfidenceInterval,
    PerQueryValues,
    bootstrap_interval,
    bootstrap_intervals,
    compare_per_query,
    paired_bootstrap,
)
from pytorch_metric_learning.evaluation.retrieval.bootstrap import (
    _index_resamples,
    _level_resamples,
)


def naive_percentile_bootstrap(values, level, num_resamples, seed):
    """The textbook loop: draw n indices with replacement, average, take quantiles."""
    rng = np.random.default_rng(seed)
    n = len(values)
    means = [values[rng.integers(0, n, n)].mean() for _ in range(num_resamples)]
    tail = (1 - level) / 2
    return np.quantile(means, tail), np.quantile(means, 1 - tail)


@pytest.mark.parametrize("binary", [True, False])
def test_interval_agrees_with_a_naive_loop(binary):
    rng = np.random.default_rng(1)
    values = (rng.random(2000) < 0.3).astype(float) if binary else rng.gamma(2.0, size=2000)
    got = bootstrap_interval(torch.from_numpy(values), num_resamples=4000, seed=5)
    low, high = naive_percentile_bootstrap(values, 0.95, 4000, seed=7)
    width = high - low
    assert got.estimate == pytest.approx(values.mean())
    assert got.low == pytest.approx(low, abs=0.05 * width)
    assert got.high == pytest.approx(high, abs=0.05 * width)


def test_level_shortcut_and_index_resampling_have_the_same_distribution():
    rng = np.random.default_rng(0)
    values = rng.choice([0.0, 0.25, 0.5, 1.0], size=500, p=[0.4, 0.3, 0.2, 0.1])
    levels, counts = np.unique(values, return_counts=True)
    shortcut = _level_resamples(levels, counts, 20000, np.random.default_rng(1))
    drawn = _index_resamples(values, 20000, np.random.default_rng(2))
    assert shortcut.mean() == pytest.approx(values.mean(), abs=1e-3)
    assert shortcut.std() == pytest.approx(values.std() / math.sqrt(500), rel=0.03)
    assert np.quantile(shortcut, [0.025, 0.5, 0.975]) == pytest.approx(
        np.quantile(drawn, [0.025, 0.5, 0.975]), abs=0.01
    )


def test_intervals_shrink_as_the_test_set_grows():
    rng = np.random.default_rng(0)
    widths = []
    for n in (100, 1000, 10000):
        values = torch.from_numpy((rng.random(n) < 0.6).astype(float))
        interval = bootstrap_interval(values, seed=0)
        widths.append(interval.high - interval.low)
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(10, rel=0.3)  # width ~ 1 / sqrt(n)


@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False])
def test_coverage_is_close_to_nominal(binary):
    """400 simulated test sets with a known mean: about 95% of the intervals contain it."""
    rng = np.random.default_rng(2024)
    true_mean = 0.3 if binary else 2 / 7  # Bernoulli(0.3) or Beta(2, 5)
    covered = 0
    for trial in range(400):
        values = (rng.random(400) < 0.3).astype(float) if binary else rng.beta(2, 5, 400)
        interval = bootstrap_interval(torch.from_numpy(values), num_resamples=1000, seed=trial)
        covered += interval.low <= true_mean <= interval.high
    assert 0.93 <= covered / 400 <= 0.97


@pytest.mark.slow
def test_class_resampling_covers_when_queries_of_a_class_are_correlated():
    """Queries of one class share a class effect: resampling queries is too optimistic,
    resampling whole classes is not."""
    rng = np.random.default_rng(7)
    groups = torch.arange(30).repeat_interleave(10)
    by_query = by_class = 0
    for trial in range(300):
        effect = rng.normal(0.0, 1.0, 30).repeat(10)
        values = torch.from_numpy(effect + rng.normal(0.0, 0.3, 300))
        query_ci = bootstrap_interval(values, num_resamples=500, seed=trial)
        class_ci = bootstrap_interval(values, num_resamples=500, seed=trial, groups=groups)
        by_query += query_ci.low <= 0.0 <= query_ci.high
        by_class += class_ci.low <= 0.0 <= class_ci.high
    assert by_query / 300 < 0.6
    assert 0.88 <= by_class / 300 <= 0.98


@pytest.mark.slow
def test_paired_false_positive_rate_is_near_its_level():
    """Two models with the same per-query success probabilities: B is no better than A, so
    p <= 0.05 should happen about 5% of the time."""
    rng = np.random.default_rng(11)
    rejections = 0
    for trial in range(400):
        difficulty = rng.random(500)
        a = (rng.random(500) < difficulty).astype(float)
        b = (rng.random(500) < difficulty).astype(float)
        result = paired_bootstrap(torch.from_numpy(a), torch.from_numpy(b), seed=trial)
        rejections += result.p_value <= 0.05
    assert 0.025 <= rejections / 400 <= 0.075


def test_paired_test_detects_a_real_improvement_and_pairs_the_queries():
    rng = np.random.default_rng(3)
    difficulty = rng.random(2000)
    a = torch.from_numpy((rng.random(2000) < difficulty).astype(float))
    b = torch.from_numpy((rng.random(2000) < np.minimum(difficulty + 0.05, 1)).astype(float))
    result = paired_bootstrap(a, b, seed=0)
    assert result.difference == pytest.approx(float(b.mean() - a.mean()))
    assert result.p_value < 0.01 and result.low > 0
    reverse = paired_bootstrap(b, a, seed=0)
    assert reverse.p_value > 0.99 and reverse.high < 0


def test_identical_models_are_never_better():
    values = torch.tensor([1.0, 0.0, 1.0] * 30)
    result = paired_bootstrap(values, values.clone())
    assert result.difference == 0 and result.low == 0 and result.high == 0
    assert result.p_value == 1.0


def test_seeded_results_repeat():
    values = torch.from_numpy(np.random.default_rng(0).random(300))
    assert bootstrap_interval(values, seed=4) == bootstrap_interval(values, seed=4)
    assert bootstrap_interval(values, seed=4) != bootstrap_interval(values, seed=5)


def test_intervals_and_comparisons_from_the_calculator():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(400) % 8
    good, bad = torch.randn(400, 4, generator=gen), torch.randn(400, 4, generator=gen)
    good[:, 0] += 3 * y
    calc = AccuracyCalculator(include=("recall_at_1", "recall_at_4", "r_precision"))
    a = calc.get_accuracy(bad, y, return_per_query=True)
    b = calc.get_accuracy(good, y, return_per_query=True)
    intervals = bootstrap_intervals(b["per_query"], seed=0)
    by_class = bootstrap_intervals(b["per_query"], seed=0, by_class=True)
    for name in ("recall_at_1", "recall_at_4", "r_precision"):
        assert intervals[name].estimate == pytest.approx(b[name])
        assert intervals[name].low <= b[name] <= intervals[name].high
        assert isinstance(by_class[name], ConfidenceInterval)
    compared = compare_per_query(a["per_query"], b["per_query"], seed=0)
    assert compared["recall_at_1"].a == pytest.approx(a["recall_at_1"])
    assert compared["recall_at_1"].b == pytest.approx(b["recall_at_1"])
    assert compared["recall_at_1"].p_value < 0.01


def test_empty_per_query_values_give_nan_intervals():
    empty = PerQueryValues(
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        {"recall_at_1": torch.zeros(0, dtype=torch.float64)},
    )
    interval = bootstrap_intervals(empty)["recall_at_1"]
    assert math.isnan(interval.estimate) and math.isnan(interval.low)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: bootstrap_interval(torch.ones(5), level=95), ValueError, "'level'"),
        (lambda: bootstrap_interval(torch.ones(5), num_resamples=0), ValueError, "num_resamples"),
        (lambda: bootstrap_interval([1.0, 2.0]), TypeError, "'values'"),
        (lambda: bootstrap_interval(torch.ones(2, 2)), ValueError, "1-D"),
        (lambda: bootstrap_interval(torch.tensor([1.0, math.nan])), ValueError, "NaN"),
        (
            lambda: bootstrap_interval(torch.ones(3), groups=torch.ones(2).long()),
            ValueError,
            "groups",
        ),
        (lambda: paired_bootstrap(torch.ones(3), torch.ones(4)), ValueError, "one length"),
        (lambda: bootstrap_intervals({"recall_at_1": torch.ones(3)}), TypeError, "PerQueryValues"),
    ],
)
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_comparing_different_queries_is_an_error():
    calc = AccuracyCalculator(include=("recall_at_1",))
    x = torch.randn(20, 2)
    a = calc.get_accuracy(x, torch.arange(20) % 4, return_per_query=True)["per_query"]
    y = torch.arange(20) % 4
    y[0] = 9  # now a lone query: different scored queries
    b = calc.get_accuracy(x, y, return_per_query=True)["per_query"]
    with pytest.raises(ValueError, match="same queries"):
        compare_per_query(a, b)


def test_equal_metrics_get_equal_intervals():
    calc = AccuracyCalculator(include=("precision_at_1", "recall_at_1"))
    x, y = torch.randn(200, 3), torch.arange(200) % 5
    per_query = calc.get_accuracy(x, y, return_per_query=True)["per_query"]
    intervals = bootstrap_intervals(per_query, seed=3)
    assert intervals["precision_at_1"] == intervals["recall_at_1"]


_PLAIN = torch.tensor([1.0, 0.0, 1.0, 1.0])
_GROUPS = torch.tensor([0, 0, 1, 1])
_ODD = {
    "meta": lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
    "sparse": lambda t: t.to_sparse(),
    "complex": lambda t: t.to(torch.complex64),
}
# Every tensor parameter of every public function that takes raw tensors.
_CALLS = {
    ("bootstrap_interval", "values"): lambda odd: bootstrap_interval(odd),
    ("bootstrap_interval", "groups"): lambda odd: bootstrap_interval(_PLAIN, groups=odd),
    ("paired_bootstrap", "values_a"): lambda odd: paired_bootstrap(odd, _PLAIN),
    ("paired_bootstrap", "values_b"): lambda odd: paired_bootstrap(_PLAIN, odd),
    ("paired_bootstrap", "groups"): lambda odd: paired_bootstrap(_PLAIN, _PLAIN, groups=odd),
}


@pytest.mark.parametrize("what", sorted(_ODD))
@pytest.mark.parametrize(("owner", "param"), sorted(_CALLS))
def test_odd_tensors_are_refused_up_front(owner: str, param: str, what: str) -> None:
    plain = _GROUPS if param == "groups" else _PLAIN
    with pytest.raises(InvalidTypeError, match=f"'{param}' parameter of {owner}.*{what}"):
        _CALLS[(owner, param)](_ODD[what](plain))
