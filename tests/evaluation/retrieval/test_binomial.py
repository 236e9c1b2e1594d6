"""Clopper-Pearson intervals: the beta quantile against SciPy, the choice of method, and
the coverage promised near 0 and 1, measured by simulation."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import special, stats

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import (
    PerQueryValues,
    bootstrap_interval,
    bootstrap_intervals,
    clopper_pearson,
)
from pytorch_metric_learning.evaluation.retrieval.binomial import (
    beta_quantile,
    regularized_incomplete_beta,
)

SHAPES = [(0.5, 0.5), (1, 1), (2, 30), (30, 2), (0.5, 999.5), (999, 2), (5000, 17), (250_000, 3)]


@pytest.mark.parametrize("a, b", SHAPES)
@pytest.mark.parametrize("q", [1e-6, 0.025, 0.3, 0.5, 0.975, 1 - 1e-6])
def test_beta_quantile_equals_scipy(a, b, q):
    expected = stats.beta.ppf(q, a, b)
    assert beta_quantile(q, a, b) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("a, b", SHAPES)
@pytest.mark.parametrize("p", [1e-4, 0.1, 0.5, 0.9, 0.999])
def test_incomplete_beta_equals_scipy(a, b, p):
    expected = special.betainc(a, b, p)
    assert regularized_incomplete_beta(p, a, b) == pytest.approx(expected, rel=1e-9, abs=1e-13)


@pytest.mark.parametrize(
    "successes, trials", [(0, 1), (1, 1), (0, 30), (30, 30), (29, 30), (50, 100), (990, 1000)]
)
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_clopper_pearson_equals_scipy(successes, trials, level):
    expected = stats.binomtest(successes, trials).proportion_ci(level, method="exact")
    low, high = clopper_pearson(successes, trials, level)
    assert low == pytest.approx(expected.low, abs=1e-10)
    assert high == pytest.approx(expected.high, abs=1e-10)


def test_auto_gives_zero_one_metrics_the_binomial_interval_and_others_the_bootstrap():
    values = {
        "recall_at_1": torch.tensor([1.0, 0.0, 1.0, 1.0] * 25, dtype=torch.float64),
        "mean_average_precision_at_r": torch.linspace(0, 1, 100, dtype=torch.float64),
    }
    per_query = PerQueryValues(torch.arange(100), torch.arange(100) % 5, values)
    intervals = bootstrap_intervals(per_query, seed=0)
    assert intervals["recall_at_1"].method == "clopper_pearson"
    low, high = stats.binomtest(75, 100).proportion_ci(0.95, method="exact")
    assert (intervals["recall_at_1"].low, intervals["recall_at_1"].high) == pytest.approx(
        (low, high), abs=1e-10
    )
    assert intervals["mean_average_precision_at_r"].method == "percentile"
    grouped = bootstrap_intervals(per_query, seed=0, by_class=True)
    assert {i.method for i in grouped.values()} == {"percentile"}
    forced = bootstrap_intervals(per_query, seed=0, method="percentile")
    assert forced["recall_at_1"].method == "percentile"
    assert intervals["recall_at_1"].as_dict()["method"] == "clopper_pearson"


def test_all_right_gets_an_interval_below_one():
    interval = bootstrap_interval(torch.ones(30))
    assert interval.high == 1.0 and interval.low == pytest.approx(
        0.025 ** (1 / 30)
    )  # P(all 30 right) = low^30


@pytest.mark.parametrize(
    "values, kwargs, words",
    [
        (torch.ones(10), {"method": "wilson"}, "one of ['auto'"),
        (torch.full((10,), 0.5), {"method": "clopper_pearson"}, "values that are all 0 or 1"),
        (torch.ones(10), {"method": "clopper_pearson", "groups": torch.arange(10)}, "groups"),
    ],
)
def test_bad_methods_are_refused(values, kwargs, words):
    with pytest.raises(InvalidArgumentError, match="'method'") as caught:
        bootstrap_interval(values, **kwargs)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "successes, trials, level, words",
    [(-1, 3, 0.95, "'successes'"), (4, 3, 0.95, "at most 'trials' (3)"), (1, 2.0, 0.95, "'trials'"),
     (1, 3, 1.0, "'level'")],
)  # fmt: skip
def test_clopper_pearson_refuses_impossible_counts(successes, trials, level, words):
    with pytest.raises(InvalidArgumentError, match="clopper_pearson") as caught:
        clopper_pearson(successes, trials, level)
    assert words in str(caught.value)


def test_no_trials_give_nan():
    assert all(math.isnan(end) for end in clopper_pearson(0, 0))


def _coverage(num: int, rate: float, repetitions: int, method: str) -> float:
    generator = torch.Generator().manual_seed(1000 * num + int(rate * 100))
    covered = 0
    # an exact binomial interval depends only on the number of ones: one call per count
    # (the percentile bootstrap depends on the data, so it is called for every data set)
    by_count: dict[int, bool] = {}
    for _ in range(repetitions):
        values = (torch.rand(num, generator=generator, dtype=torch.float64) < rate).double()
        count = int(values.sum())
        if method == "percentile" or count not in by_count:
            interval = bootstrap_interval(values, seed=0, num_resamples=400, method=method)
            by_count[count] = interval.low <= rate <= interval.high
        covered += by_count[count]
    return covered / repetitions


@pytest.mark.slow
@pytest.mark.parametrize("num", [30, 100, 300, 1000])
@pytest.mark.parametrize("rate", [0.5, 0.9, 0.99])
def test_default_interval_of_a_zero_one_metric_covers_at_least_93_percent(num, rate):
    coverage = _coverage(num, rate, repetitions=2000, method="auto")
    assert coverage >= 0.93, f"n={num}, rate={rate}: coverage {coverage:.3f}"


@pytest.mark.slow
def test_the_percentile_bootstrap_misses_near_one_which_is_why_auto_avoids_it():
    assert _coverage(30, 0.99, repetitions=500, method="percentile") < 0.5
    assert math.isfinite(_coverage(30, 0.99, repetitions=10, method="auto"))


@pytest.mark.parametrize("other", ["mean_average_precision_at_r", "r_precision"])
def test_clopper_pearson_names_the_metric_whose_values_are_not_zero_one(other):
    from pytorch_metric_learning.evaluation import AccuracyCalculator, bootstrap_intervals

    x, y = torch.randn(60, 4), torch.arange(60) % 4
    calc = AccuracyCalculator(include=("precision_at_1", other))
    per_query = calc.get_accuracy(x, y, return_per_query=True)["per_query"]
    with pytest.raises(InvalidArgumentError, match="'method'") as caught:
        bootstrap_intervals(per_query, method="clopper_pearson")
    assert repr(other) in str(caught.value)
    assert "'precision_at_1'" not in str(caught.value)
