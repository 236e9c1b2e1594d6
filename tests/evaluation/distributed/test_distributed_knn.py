"""DistributedKNN on spawned gloo groups against a single-process CustomKNN."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _dist_workers import assert_raised_on, shard

from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.evaluation import CustomKNN


def _oracle(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    options = case["options"].get("knn_func", {})
    distance = (
        CosineSimilarity()
        if options.get("distance") == "cosine"
        else LpDistance(normalize_embeddings=False, power=2)
    )
    query, rest = case["query"], case["rest"]
    if rest is not None and case["ref_includes_query"]:
        reference = torch.cat([query, rest])
    else:
        reference = rest
    return CustomKNN(distance)(query, case["k"], reference, case["ref_includes_query"])


def _ranks_of(case: dict[str, Any], world: int) -> list[int]:
    return case.get("group_ranks", list(range(world)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "plain",
        "self",
        "self_no_reference",
        "no_reference",
        "cosine_all",
        "one_block",
        "ties",
        "ties_self",
        "scaled_up",
        "scaled_down",
        "after_failure",
        "subgroup",
    ],
)
def test_equals_single_process_custom_knn(ran, name: str) -> None:
    world, cases, results = ran
    if name not in cases:
        pytest.skip("needs 3 ranks")
    case = cases[name]
    distances, indices = _oracle(case)
    for group_rank, rank in enumerate(_ranks_of(case, world)):
        got = results[rank][name]
        assert "value" in got, got.get("traceback")
        got_distances, got_indices = got["value"]
        expected = slice(sum(case["query_counts"][:group_rank]), None)
        own = case["query_counts"][group_rank]
        assert got_indices.dtype == torch.long
        assert torch.equal(got_indices, indices[expected][:own])
        torch.testing.assert_close(got_distances, distances[expected][:own])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["labels", "labels_self", "labels_no_reference"])
def test_labels_travel_with_the_neighbours(ran, name: str) -> None:
    world, cases, results = ran
    case = cases[name]
    distances, indices = _oracle(case)
    labels = case["query_labels"]
    if case["rest"] is not None:
        rest = case["rest_labels"]
        labels = torch.cat([labels, rest]) if case["ref_includes_query"] else rest
    start = 0
    for rank in range(world):
        got = results[rank][name]
        assert "value" in got, got.get("traceback")
        got_distances, got_indices, got_labels = got["value"]
        own = slice(start, start + case["query_counts"][rank])
        start = own.stop
        assert torch.equal(got_indices, indices[own])
        torch.testing.assert_close(got_distances, distances[own])
        assert got_labels.shape == (*indices[own].shape, *labels.shape[1:])
        assert torch.equal(got_labels, labels[indices[own]])


@pytest.mark.slow
def test_ranks_outside_the_group_are_not_involved(ran) -> None:
    world, cases, results = ran
    if world != 3:
        pytest.skip("needs 3 ranks")
    assert results[1]["subgroup"]["value"] is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("k_mismatch", "must be the same on every rank"),
        ("k_zero", "positive int"),
        ("k_too_big", "must be at most"),
    ],
)
def test_invalid_arguments_raise_on_every_rank(ran, name: str, fragment: str) -> None:
    world, _, results = ran
    assert_raised_on(range(world), results, name, "InvalidArgumentError", fragment)


@pytest.mark.slow
def test_a_failing_local_search_fails_every_rank(ran) -> None:
    world, _, results = ran
    assert results[1]["local_failure"]["error_type"] == "RuntimeError"
    others = set(range(world)) - {1}
    fragments = ("rank(s) [1]", "injected failure in the local search")
    assert_raised_on(others, results, "local_failure", "DistributedEvaluationError", *fragments)
    assert all("RuntimeError" in results[rank]["local_failure"]["error_mro"] for rank in others)


@pytest.mark.slow
def test_an_absent_rank_times_out_instead_of_hanging(ran) -> None:
    world, _, results = ran
    if world != 2:
        pytest.skip("runs on 2 ranks")
    got = results[0]["absent"]
    assert got["error_type"] == "DistributedEvaluationError", got
    assert "within 1 s" in got["message"]
    assert "Another rank probably raised or stopped calling the evaluation" in got["message"]
    assert got["seconds"] < 3


def test_shard_helper_takes_consecutive_rows() -> None:
    rows = torch.arange(10).unsqueeze(1)
    assert shard(rows, [3, 0, 7], 2).flatten().tolist() == list(range(3, 10))
