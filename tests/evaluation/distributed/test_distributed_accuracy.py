"""DistributedAccuracyCalculator on spawned gloo groups against the single-process one."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _dist_workers import COMPARISONS, assert_raised_on

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator, TorchKMeans
from pytorch_metric_learning.evaluation.distributed import (
    DistributedAccuracyCalculator,
    DistributedKMeans,
    DistributedKNN,
)


def single_process(case: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """AccuracyCalculator on the shards concatenated in rank order (the global data).

    It clusters with the same k-means algorithm the ranks use (run in a group of one
    process), so NMI and AMI compare the reductions, not two clustering algorithms.
    """
    import warnings

    options = dict(case["calc"])
    if "comparison" not in case:
        options.setdefault("kmeans_func", DistributedKMeans())
    if "comparison" in case:
        options["label_comparison_fn"] = COMPARISONS[case["comparison"]]
    arguments: dict[str, Any] = {"query": case["query"], "query_labels": case["query_labels"]}
    if case["rest"] is not None:
        both = case["ref_includes_query"]
        arguments["reference"] = torch.cat([case["query"], case["rest"]]) if both else case["rest"]
        arguments["reference_labels"] = (
            torch.cat([case["query_labels"], case["rest_labels"]]) if both else case["rest_labels"]
        )
        arguments["ref_includes_query"] = both
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = AccuracyCalculator(**options).get_accuracy(**arguments, **case.get("call", {}))
    return result, [str(warning.message) for warning in caught]


def assert_same_metrics(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        values = value if isinstance(value, list) else [value]
        got_values = got[name] if isinstance(value, list) else [got[name]]
        assert len(got_values) == len(values), name
        for a, b in zip(got_values, values):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12), name


CASES = [
    "acc_clusters",
    "acc_self",
    "acc_query_ref",
    "acc_ref_includes",
    "acc_custom",
    "acc_defaults",
    "acc_call_include",
    "acc_all_lone",
    "acc_label_rows",
    "acc_after_failure",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_every_rank_returns_the_single_process_metrics(ran, one_rank_group, name: str) -> None:
    world, cases, results = ran
    expected, expected_warnings = single_process(cases[name])
    for rank in range(world):
        got = results[rank][name]
        assert "value" in got, got.get("traceback")
        metrics, caught = got["value"]
        assert_same_metrics(metrics, expected)
        assert caught == expected_warnings


@pytest.mark.slow
def test_clustering_case_is_not_trivial(ran) -> None:
    _, cases, results = ran
    metrics, _ = results[0]["acc_clusters"]["value"]
    assert 0.3 < metrics["NMI"] < 0.99 and 0.3 < metrics["AMI"] < 0.99


@pytest.mark.slow
def test_a_rank_failing_mid_evaluation_fails_every_rank(ran) -> None:
    world, _, results = ran
    assert results[1]["acc_local_failure"]["error_type"] == "RuntimeError"
    others = set(range(world)) - {1}
    failure = "injected failure in the local search"
    assert_raised_on(others, results, "acc_local_failure", "DistributedEvaluationError", failure)


@pytest.mark.slow
def test_a_label_dtype_mismatch_fails_on_every_rank(ran) -> None:
    world, _, results = ran
    fragments = ("label dtype", "must be the same on every rank")
    assert_raised_on(
        range(world), results, "acc_dtype_mismatch", "InvalidArgumentError", *fragments
    )


def test_defaults_are_distributed_backends() -> None:
    calculator = DistributedAccuracyCalculator(timeout=5)
    assert isinstance(calculator.knn_func, DistributedKNN)
    assert isinstance(calculator.kmeans_func, DistributedKMeans)
    assert isinstance(calculator, AccuracyCalculator)


def test_a_local_knn_spec_becomes_the_local_backend() -> None:
    calculator = DistributedAccuracyCalculator(knn_func={"name": "custom", "distance": "cosine"})
    assert isinstance(calculator.knn_func, DistributedKNN)
    assert calculator.knn_func.is_inverted is True


def test_a_local_kmeans_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="kmeans_func"):
        DistributedAccuracyCalculator(kmeans_func=TorchKMeans())


def test_custom_metrics_are_refused() -> None:
    class WithCustomMetric(DistributedAccuracyCalculator):
        def calculate_fancy(self, **kwargs: Any) -> float:
            return 0.0

    with pytest.raises(InvalidArgumentError, match="fancy"):
        WithCustomMetric()
    assert WithCustomMetric(exclude=("fancy",)).get_curr_metrics()


def test_one_rank_matches_accuracy_calculator_on_numpy_style_inputs(one_rank_group) -> None:
    generator = torch.Generator().manual_seed(4)
    query = torch.randn(30, 5, generator=generator)
    labels = torch.randint(4, (30,), generator=generator)
    options = {"include": ("precision_at_1", "r_precision"), "avg_of_avgs": True}
    expected = AccuracyCalculator(**options).get_accuracy(query, labels)
    got = DistributedAccuracyCalculator(**options).get_accuracy(query, labels)
    assert_same_metrics(got, expected)


def test_one_rank_reports_a_reference_that_does_not_start_with_the_query(one_rank_group) -> None:
    query = torch.randn(4, 2)
    with pytest.raises(InvalidArgumentError, match="first len"):
        DistributedAccuracyCalculator(include=("precision_at_1",)).get_accuracy(
            query, torch.arange(4), torch.randn(6, 2), torch.arange(6), True
        )
