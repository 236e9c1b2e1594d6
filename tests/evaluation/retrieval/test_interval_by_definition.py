"""``method="auto"`` chooses the binomial interval by what a metric is, not by the values it
happened to take: only ``recall_at_<K>`` and ``precision_at_1`` are 0/1 outcomes by
definition. ``mean_average_precision`` that is 1 for every query of an easy test set is
still bootstrapped (else its interval would jump to another method, and widen, as the
model gets better).

The oracle is the plain list of 0/1 metrics written here, over every built-in metric name
x (values all 0/1, values mixed), in the API and on the command line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    PerQueryValues,
    bootstrap_interval,
    bootstrap_intervals,
)

ZERO_ONE = ("precision_at_1", "recall_at_1", "recall_at_2", "recall_at_7")
OTHERS = (
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "mean_inverse_negative_penalty",
    "precision_at_2",
    "precision_at_5",
    "mean_average_precision_at_3",
    "ndcg_at_4",
)
NAMES = ZERO_ONE + OTHERS
KINDS = ("all_zero_one", "mixed")


def _values(kind: str, n: int = 60) -> torch.Tensor:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2, n).astype(np.float64)
    if kind == "mixed":
        values[::3] = 0.5
    return torch.from_numpy(values)


def _expected_method(name: str, kind: str) -> str:
    return "clopper_pearson" if name in ZERO_ONE and kind == "all_zero_one" else "percentile"


@pytest.mark.parametrize("kind", KINDS)
def test_intervals_of_every_metric_go_by_its_definition(kind):
    values = {name: _values(kind) for name in NAMES}
    per_query = PerQueryValues(
        torch.arange(60), torch.arange(60) % 4, values, first_relevant_rank=torch.ones(60)
    )
    intervals = bootstrap_intervals(per_query, num_resamples=50)
    assert {name: found.method for name, found in intervals.items()} == {
        name: _expected_method(name, kind) for name in NAMES
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_one_named_interval_goes_by_the_definition(name, kind):
    found = bootstrap_interval(_values(kind), num_resamples=50, metric=name)
    assert found.method == _expected_method(name, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_unnamed_values_are_binomial_when_all_zero_one(kind):
    found = bootstrap_interval(_values(kind), num_resamples=50)
    assert found.method == ("clopper_pearson" if kind == "all_zero_one" else "percentile")


def _easy_data():
    """Classes far apart: every query's neighbours are all relevant first, so every
    metric is 1 for every query (all 0/1 values, for every metric)."""
    labels = torch.arange(40) % 4
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0)) * 0.01
    x[:, 0] += 10.0 * labels
    return x, labels


def test_an_easy_case_bootstraps_the_metrics_that_only_happen_to_be_zero_one():
    x, labels = _easy_data()
    include = ("precision_at_1", "recall_at_2", *OTHERS[:5])
    calc = AccuracyCalculator(include=include, k=None)
    per_query = calc.get_accuracy(x, labels, return_per_query=True)["per_query"]
    for name in include:
        assert bool(((per_query.values[name] == 0) | (per_query.values[name] == 1)).all())
    intervals = bootstrap_intervals(per_query, num_resamples=50)
    assert {name: found.method for name, found in intervals.items()} == {
        name: ("clopper_pearson" if name in ZERO_ONE else "percentile") for name in include
    }


def test_the_command_line_goes_by_the_definition(capsys, tmp_path):
    from pytorch_metric_learning.cli import main

    x, labels = _easy_data()
    np.save(tmp_path / "q.npy", x.numpy())
    np.savetxt(tmp_path / "y.csv", labels.numpy(), fmt="%d")
    metrics = "precision_at_1,recall_at_2,mean_average_precision,r_precision,mean_reciprocal_rank"
    out = tmp_path / "out.json"
    code = main([
        "evaluate", str(tmp_path / "q.npy"), "--labels", str(tmp_path / "y.csv"),
        "--metrics", metrics, "--k", "all", "--ci", "95", "--output", str(out),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    methods = {
        name: found["method"] for name, found in json.loads(out.read_text())["intervals"].items()
    }
    assert methods == {
        name: ("clopper_pearson" if name in ZERO_ONE else "percentile")
        for name in metrics.split(",")
    }
