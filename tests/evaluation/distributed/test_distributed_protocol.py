"""The re-identification protocol and exclusion rules across ranks (2-process gloo).

DistributedAccuracyCalculator with groups, junk and distractor labels and excluded pairs
must equal the single-process AccuracyCalculator on the shards concatenated in rank order
(to 1e-12, the queries left out counted the same); DistributedKNN with a ShardExclusion
must return the candidates a brute-force loop written here finds.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _protocol_workers import main, shard_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _gloo import spawn_ranks
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.distributed import DistributedAccuracyCalculator

WORLD = 2
METRICS = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_inverse_negative_penalty",
    "mean_reciprocal_rank",
)


def _data(seed: int, num_query: int, num_rest: int) -> dict[str, Any]:
    """Clustered embeddings with labels in -1..6 (-1 junk, 0 distractor) and 3 cameras.

    Two queries of label 5 see label 5 only under their own camera and one query of label
    6 is alone, so every case leaves queries out."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.tensor([5, 5, 6])
    query_labels = torch.cat([torch.randint(1, 5, (num_query - 3,), generator=g), fixed])
    rest_labels = torch.cat([torch.randint(-1, 5, (num_rest - 2,), generator=g), fixed[:2]])
    query_groups = torch.cat([torch.randint(0, 3, (num_query - 3,), generator=g), fixed * 0])
    rest_groups = torch.cat([torch.randint(0, 3, (num_rest - 2,), generator=g), fixed[:2] * 0])

    def embed(labels: torch.Tensor) -> torch.Tensor:
        centres = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed + 1))
        noise = torch.randn(len(labels), 4, generator=g, dtype=torch.float64)
        return centres.double()[labels + 1] + 0.8 * noise

    return {
        "query": embed(query_labels),
        "query_labels": query_labels,
        "rest": embed(rest_labels),
        "rest_labels": rest_labels,
        "query_groups": query_groups,
        "rest_groups": rest_groups,
    }


def _pairs(seed: int, num_query: int, num_reference: int, count: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pairs = torch.stack(
        [
            torch.randint(0, num_query, (count,), generator=g),
            torch.randint(0, num_reference, (count,), generator=g),
        ],
        dim=1,
    )
    return torch.cat([pairs, pairs[:3]])  # duplicates are harmless


def _accuracy_cases() -> list[dict[str, Any]]:
    cases = []
    data = _data(0, 23, 31)
    market = {"junk_labels": (-1,), "distractor_labels": (0,)}
    for mode in ("separate", "includes", "one_set"):
        num_reference = {"separate": 31, "includes": 54, "one_set": 23}[mode]
        for with_groups, with_pairs, pairs_on in (
            (True, False, "own"),
            (True, True, "own"),
            (False, True, "rank0"),
        ):
            case = {"kind": "accuracy", "mode": mode, "include": METRICS, "k": None,
                    "query_counts": [9, 14], "rest_counts": [20, 11], **data}  # fmt: skip
            case["name"] = f"{mode}-groups{int(with_groups)}-pairs{int(with_pairs)}"
            if not with_groups:
                del case["query_groups"], case["rest_groups"]
            if mode != "one_set":
                case.update(market)
            if with_pairs:
                case["excluded_pairs"] = _pairs(1, 23, num_reference, 40)
                case["pairs_on"] = pairs_on
            cases.append(case)
    empty_shard = dict(cases[1], name="empty-query-shard", query_counts=[0, 23])
    small_k = dict(cases[4], name="k3", k=3)
    return [*cases, empty_shard, small_k]


def _knn_cases() -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(5)
    query, rest = torch.randn(17, 3, generator=g), torch.randn(25, 3, generator=g)
    return [
        {
            "kind": "knn",
            "name": f"knn-block{block}",
            "block_size": block,
            "k": 15,
            "query": query,
            "rest": rest,
            "query_counts": [7, 10],
            "rest_counts": [12, 13],
            "query_keys": torch.randint(0, 2, (17, 2), generator=g),
            "reference_keys": torch.randint(0, 2, (25, 2), generator=g),
            "pairs": _pairs(6, 17, 25, 60),
            "never": torch.rand(25, generator=g) < 0.3,
        }  # fmt: skip
        for block in (2, 64)
    ]


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    plan = _accuracy_cases() + _knn_cases()
    results = spawn_ranks(main, plan, WORLD, str(tmp_path_factory.mktemp("protocol")))
    return {case["name"]: case for case in plan}, results


def _single_process(case: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """AccuracyCalculator on the global data, in DistributedKNN's global numbering."""
    arguments: dict[str, Any] = {"query": case["query"], "query_labels": case["query_labels"]}
    groups = case.get("query_groups")
    if case["mode"] == "separate":
        arguments.update(reference=case["rest"], reference_labels=case["rest_labels"])
        if groups is not None:
            arguments["reference_groups"] = case["rest_groups"]
    elif case["mode"] == "includes":
        arguments.update(
            reference=torch.cat([case["query"], case["rest"]]),
            reference_labels=torch.cat([case["query_labels"], case["rest_labels"]]),
            ref_includes_query=True,
        )
        if groups is not None:
            arguments["reference_groups"] = torch.cat([groups, case["rest_groups"]])
    if groups is not None:
        arguments["query_groups"] = groups
    for name in ("junk_labels", "distractor_labels", "excluded_pairs"):
        if name in case:
            arguments[name] = case[name]
    calc = AccuracyCalculator(k=case["k"], include=case["include"])
    return calc.get_accuracy(**arguments), calc.last_num_queries_left_out


@pytest.mark.slow
@pytest.mark.parametrize("name", [case["name"] for case in _accuracy_cases()])
def test_protocol_across_ranks_equals_one_process(ran, name: str) -> None:
    cases, results = ran
    case = cases[name]
    expected, left_out = _single_process(case)
    assert left_out > 0  # the cases leave queries out, so the count is checked
    for rank in range(WORLD):
        got = results[rank][name]
        assert "error" not in got, got.get("error")
        assert got["left_out"] == left_out
        assert set(got["values"]) == set(expected)
        for metric, value in expected.items():
            assert _same(got["values"][metric], value), metric


def _brute_force(case: dict[str, Any]) -> tuple[list[list[float]], list[list[int]]]:
    """The first k candidates of each query, by squared distance then index, plainly."""
    found_distances, found_indices = [], []
    pairs = {tuple(pair) for pair in case["pairs"].tolist()}
    for q, row in enumerate(case["query"]):
        candidates = []
        for r, other in enumerate(case["rest"]):
            same = torch.equal(case["query_keys"][q], case["reference_keys"][r])
            if same or bool(case["never"][r]) or (q, r) in pairs:
                continue
            candidates.append((float(((row - other) ** 2).sum()), r))
        candidates.sort()
        chosen = candidates[: case["k"]]
        missing = case["k"] - len(chosen)
        found_distances.append([d for d, _ in chosen] + [math.inf] * missing)
        found_indices.append([r for _, r in chosen] + [-1] * missing)
    return found_distances, found_indices


@pytest.mark.slow
@pytest.mark.parametrize("name", ["knn-block2", "knn-block64"])
def test_sharded_knn_exclusion_equals_brute_force(ran, name: str) -> None:
    cases, results = ran
    case = cases[name]
    distances, indices = _brute_force(case)
    assert any(-1 in row for row in indices)  # some query runs out of candidates
    got_indices = torch.cat([results[rank][name]["indices"] for rank in range(WORLD)])
    got_distances = torch.cat([results[rank][name]["distances"] for rank in range(WORLD)])
    assert got_indices.tolist() == indices
    assert torch.allclose(got_distances, torch.tensor(distances), rtol=1e-5, atol=1e-5)


def test_roles_are_refused_by_name(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(include=("precision_at_1",))
    x = torch.tensor([[0.0], [1.0]])
    with pytest.raises(InvalidArgumentError, match="is_query"):
        calc.get_accuracy(x, torch.tensor([0, 0]), is_query=torch.tensor([True, True]))


@pytest.mark.parametrize(
    "options",
    [{"single_gallery_shot": True}, {"single_gallery_shot": True, "single_gallery_shot_draws": 3}],
)
def test_single_gallery_shot_is_refused_by_name(one_rank_group, options) -> None:
    calc = DistributedAccuracyCalculator(include=("precision_at_1",))
    x, labels, groups = torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0]), torch.tensor([0, 1])
    with pytest.raises(InvalidArgumentError, match="single_gallery_shot"):
        calc.get_accuracy(
            x, labels, x, labels, query_groups=groups, reference_groups=groups, **options
        )


def test_groups_need_both_sides(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(include=("precision_at_1",))
    x = torch.tensor([[0.0], [1.0]])
    with pytest.raises(InvalidArgumentError, match="reference_groups"):
        calc.get_accuracy(x, torch.tensor([0, 0]), x, torch.tensor([0, 0]),
                          query_groups=torch.tensor([0, 1]))  # fmt: skip


def test_pairs_out_of_range_are_named(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(include=("precision_at_1",))
    x = torch.tensor([[0.0], [1.0]])
    with pytest.raises(InvalidArgumentError, match="global reference row numbers"):
        calc.get_accuracy(x, torch.tensor([0, 0]), x, torch.tensor([0, 0]),
                          excluded_pairs=torch.tensor([[0, 5]]))  # fmt: skip


def _same(got: float, expected: float) -> bool:
    """Equal to 1e-12, or both NaN (every query left out)."""
    if math.isnan(expected):
        return math.isnan(got)
    return math.isclose(got, expected, rel_tol=0, abs_tol=1e-12)


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(["separate", "includes", "one_set"]),
    with_groups=st.booleans(),
    num_pairs=st.integers(0, 30),
    market=st.booleans(),
)
def test_one_rank_equals_one_process_for_any_options(
    one_rank_group, seed: int, mode: str, with_groups: bool, num_pairs: int, market: bool
) -> None:
    """In a group of one rank, every combination of the options gives AccuracyCalculator's
    values and left-out count (the counting of R, without the exchange)."""
    data = _data(seed, 12, 15)
    case: dict[str, Any] = {"mode": mode, "include": METRICS, "k": None, **data}
    case.update(query_counts=[12], rest_counts=[15])
    if not with_groups:
        del case["query_groups"], case["rest_groups"]
    if market and mode != "one_set":
        case.update(junk_labels=(-1,), distractor_labels=(0,))
    if num_pairs:
        num_reference = {"separate": 15, "includes": 27, "one_set": 12}[mode]
        case["excluded_pairs"] = _pairs(seed, 12, num_reference, num_pairs)
    expected, left_out = _single_process(case)
    calc = DistributedAccuracyCalculator(k=None, include=METRICS)
    got = calc.get_accuracy(**shard_inputs(case, 0))
    assert calc.last_num_queries_left_out == left_out
    for metric, value in expected.items():
        assert _same(got[metric], value), metric


def test_a_custom_comparison_refusal_names_the_groups(one_rank_group) -> None:
    calc = DistributedAccuracyCalculator(
        include=("precision_at_1",), label_comparison_fn=lambda a, b: a == b
    )
    x, labels, groups = torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0]), torch.tensor([0, 1])
    with pytest.raises(InvalidArgumentError) as caught:
        calc.get_accuracy(x, labels, x, labels, query_groups=groups, reference_groups=groups)
    for name in ("'query_groups'", "'reference_groups'", "'label_comparison_fn'"):
        assert name in str(caught.value)
