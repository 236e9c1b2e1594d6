"""Code that runs inside the spawned ranks of the distributed protocol tests.

Each case holds the full (unsharded) data and how it is sharded; every rank runs
DistributedAccuracyCalculator (and DistributedKNN with a ShardExclusion) on its shards.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from _gloo import join_gloo_group
from pytorch_metric_learning.evaluation.distributed import (
    DistributedAccuracyCalculator,
    DistributedKNN,
    ShardExclusion,
)

GROUP_TIMEOUT_S = 30


def cut(rows: torch.Tensor | None, counts: list[int], rank: int) -> torch.Tensor | None:
    if rows is None:
        return None
    start = sum(counts[:rank])
    return rows[start : start + counts[rank]]


def pairs_of_rank(pairs: torch.Tensor | None, counts: list[int], rank: int, how: str) -> Any:
    """``"own"``: the pairs of this rank's queries; ``"rank0"``: all pairs on rank 0."""
    if pairs is None:
        return None
    if how == "rank0":
        return pairs if rank == 0 else None
    start = sum(counts[:rank])
    mine = (pairs[:, 0] >= start) & (pairs[:, 0] < start + counts[rank])
    return pairs[mine]


def shard_inputs(case: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's arguments for get_accuracy (global pair numbers, local rows)."""
    qc, rc = case["query_counts"], case["rest_counts"]
    query, labels = cut(case["query"], qc, rank), cut(case["query_labels"], qc, rank)
    groups = cut(case.get("query_groups"), qc, rank)
    arguments: dict[str, Any] = {"query": query, "query_labels": labels}
    if case["mode"] != "one_set":
        rest, rest_labels = cut(case["rest"], rc, rank), cut(case["rest_labels"], rc, rank)
        rest_groups = cut(case.get("rest_groups"), rc, rank)
        both = case["mode"] == "includes"
        arguments["reference"] = torch.cat([query, rest]) if both else rest
        arguments["reference_labels"] = torch.cat([labels, rest_labels]) if both else rest_labels
        arguments["ref_includes_query"] = both
        if groups is not None:
            arguments["reference_groups"] = (
                torch.cat([groups, rest_groups]) if both else rest_groups
            )
    if groups is not None:
        arguments["query_groups"] = groups
    for name in ("junk_labels", "distractor_labels"):
        if name in case:
            arguments[name] = case[name]
    arguments["excluded_pairs"] = pairs_of_rank(
        case.get("excluded_pairs"), qc, rank, case.get("pairs_on", "own")
    )
    return arguments


def _run_accuracy(case: dict[str, Any], rank: int) -> dict[str, Any]:
    calc = DistributedAccuracyCalculator(k=case.get("k"), include=case["include"])
    values = calc.get_accuracy(**shard_inputs(case, rank))
    return {"values": values, "left_out": calc.last_num_queries_left_out}


def _run_knn(case: dict[str, Any], rank: int) -> dict[str, Any]:
    qc, rc = case["query_counts"], case["rest_counts"]
    rule = ShardExclusion(
        cut(case["query_keys"], qc, rank),
        cut(case["reference_keys"], rc, rank),
        pairs_of_rank(case["pairs"], qc, rank, "own"),
        cut(case["never"], rc, rank),
    )
    knn = DistributedKNN(block_size=case["block_size"])
    distances, indices = knn(
        cut(case["query"], qc, rank), case["k"], cut(case["rest"], rc, rank), exclusion=rule
    )
    return {"distances": distances, "indices": indices}


def _run(case: dict[str, Any], rank: int) -> dict[str, Any]:
    try:
        return (_run_knn if case["kind"] == "knn" else _run_accuracy)(case, rank)
    except Exception as error:  # returned to the test, which names it
        return {"error": f"{type(error).__name__}: {error}"}


def main(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    join_gloo_group(directory, rank, world_size, GROUP_TIMEOUT_S)
    plan = torch.load(os.path.join(directory, "plan.pt"), weights_only=False)
    results = {case["name"]: _run(case, rank) for case in plan}
    torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
