"""DistributedKNN on spawned gloo groups against a single-process CustomKNN."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _dist_workers import shard, spawn

from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.evaluation import CustomKNN

DIMS = 6


def _case(name: str, query_counts: list[int], rest_counts: list[int] | None, **extra: Any):
    generator = torch.Generator().manual_seed(len(name) * 7919 + sum(query_counts))
    case = {
        "name": name,
        "kind": "knn",
        "query": torch.randn(sum(query_counts), DIMS, generator=generator),
        "query_counts": query_counts,
        "rest": None,
        "ref_includes_query": False,
        "options": {"block_size": 3},
    }
    if rest_counts is not None:
        case["rest"] = torch.randn(sum(rest_counts), DIMS, generator=generator)
        case["rest_counts"] = rest_counts
    case.update(extra)
    return case


def _plan(world: int) -> list[dict[str, Any]]:
    pick = {2: lambda a, b: a[:2], 3: lambda a, b: a}
    uneven = pick[world]([5, 0, 9], None)
    others = pick[world]([7, 11, 0], None)
    plan = [
        _case("plain", uneven, others, k=4),
        _case(
            "self",
            pick[world]([4, 6, 0], None),
            pick[world]([3, 0, 8], None),
            k=5,
            ref_includes_query=True,
        ),
        _case("self_no_reference", uneven, None, k=3, ref_includes_query=True),
        _case("no_reference", uneven, None, k=2),
        _case(
            "cosine_all",
            uneven,
            others,
            k=sum(others),
            options={"knn_func": {"name": "custom", "distance": "cosine"}, "block_size": 2},
        ),
        _case("one_block", uneven, others, k=1, options={"block_size": 64}),
        _case("k_mismatch", uneven, others, k=[3, 4, 3][:world]),
        _case("k_zero", uneven, others, k=0),
        _case("k_too_big", uneven, others, k=sum(others) + 1),
        _case("local_failure", uneven, others, k=2, fail_on_rank=1),
        _case("after_failure", uneven, others, k=2),
    ]
    if world == 3:
        plan.append(_case("subgroup", [4, 7], [6, 2], k=3, group_ranks=[0, 2]))
    return plan


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def ran(request, tmp_path_factory) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    world = request.param
    plan = _plan(world)
    results = spawn(plan, world, str(tmp_path_factory.mktemp(f"knn{world}")))
    return world, {case["name"]: case for case in plan}, results


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
    for rank in range(world):
        got = results[rank][name]
        assert got.get("error_type") == "InvalidArgumentError", got
        assert fragment in got["message"]


@pytest.mark.slow
def test_a_failing_local_search_fails_every_rank(ran) -> None:
    world, _, results = ran
    assert results[1]["local_failure"]["error_type"] == "RuntimeError"
    for rank in set(range(world)) - {1}:
        got = results[rank]["local_failure"]
        assert got["error_type"] == "DistributedEvaluationError"
        assert "RuntimeError" in got["error_mro"]
        assert "rank(s) [1]" in got["message"]
        assert "injected failure in the local search" in got["message"]


@pytest.mark.slow
def test_an_absent_rank_times_out_instead_of_hanging(tmp_path) -> None:
    case = _case(
        "absent",
        [3, 4],
        [5, 2],
        kind="absent_rank",
        k=2,
        absent=1,
        sleep_s=4,
        breaks_group=True,
        options={"timeout": 1.5},
    )
    results = spawn([case], 2, str(tmp_path))
    got = results[0]["absent"]
    assert got["error_type"] == "DistributedEvaluationError", got
    assert "within 1.5 s" in got["message"]
    assert "Another rank probably raised or stopped calling the evaluation" in got["message"]
    assert got["seconds"] < 4


def test_shard_helper_takes_consecutive_rows() -> None:
    rows = torch.arange(10).unsqueeze(1)
    assert shard(rows, [3, 0, 7], 2).flatten().tolist() == list(range(3, 10))
