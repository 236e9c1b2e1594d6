"""Code that runs inside the spawned ranks of the distributed tests.

A *plan* is a list of cases (plain dicts holding the full, unsharded data); every rank runs
every case on its own shards and returns what it got, or the error it raised.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterable
from typing import Any, Callable

import torch
import torch.distributed as dist

from _gloo import join_gloo_group, spawn_ranks

GROUP_TIMEOUT_S = 20


def spawn(plan: list[dict[str, Any]], world_size: int, directory: str) -> list[dict[str, Any]]:
    """Run ``plan`` on a fresh gloo group of ``world_size`` CPU processes; results by rank."""
    return spawn_ranks(_main, plan, world_size, directory)


def shard(rows: torch.Tensor, counts: list[int], rank: int) -> torch.Tensor:
    start = sum(counts[:rank])
    return rows[start : start + counts[rank]]


def assert_raised_on(
    ranks: Iterable[int], results: list[dict[str, Any]], name: str, error: str, *fragments: str
) -> None:
    """Case ``name`` raised an error of type ``error`` on each of ``ranks``, its message
    holding every one of ``fragments``."""
    for rank in ranks:
        got = results[rank][name]
        assert got.get("error_type") == error, got
        for fragment in fragments:
            assert fragment in got["message"], (fragment, got)


def _main(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    join_gloo_group(directory, rank, world_size, GROUP_TIMEOUT_S)
    plan = torch.load(os.path.join(directory, "plan.pt"), weights_only=False)
    results: dict[str, Any] = {}
    for case in plan:
        results[case["name"]] = _run_case(case, rank)
    torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
    if not any(case.get("breaks_group") for case in plan):
        dist.barrier()
    dist.destroy_process_group()


def _run_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    started = time.monotonic()
    try:
        value = RUNNERS[case["kind"]](case, rank)
    except Exception as error:
        return {
            "error_type": type(error).__name__,
            "error_mro": [cls.__name__ for cls in type(error).__mro__],
            "message": str(error),
            "traceback": traceback.format_exc(),
            "seconds": time.monotonic() - started,
        }
    return {"value": value, "seconds": time.monotonic() - started}


def _knn_case(case: dict[str, Any], rank: int) -> Any:
    from pytorch_metric_learning.evaluation import load_knn_func

    group = _group(case)
    if group is not None and dist.get_rank(group) < 0:
        return None
    group_rank = rank if group is None else dist.get_rank(group)
    query = shard(case["query"], case["query_counts"], group_rank)
    reference = _reference_shard(case, group_rank, "query", "rest")
    options = dict(case.get("options", {}))
    if "fail_on_rank" in case and rank == case["fail_on_rank"]:
        options["knn_func"] = _raising_knn
    knn = load_knn_func({"name": "torch_distributed", **options}, group=group)
    k = case["k"][rank] if isinstance(case["k"], list) else case["k"]
    if "query_labels" in case:
        labels = _reference_shard(case, group_rank, "query_labels", "rest_labels")
        if labels is None:
            labels = shard(case["query_labels"], case["query_counts"], group_rank)
        return knn.search_with_labels(query, k, reference, labels, case["ref_includes_query"])
    return knn(query, k, reference, case["ref_includes_query"])


def _reference_shard(case: dict[str, Any], rank: int, own: str, rest: str) -> Any:
    """This rank's reference rows (or labels): its rest rows, after its queries if included."""
    if case.get(rest) is None:
        return None
    rest_rows = shard(case[rest], case["rest_counts"], rank)
    if case["ref_includes_query"]:
        return torch.cat([shard(case[own], case["query_counts"], rank), rest_rows])
    return rest_rows


def _absent_rank_case(case: dict[str, Any], rank: int) -> Any:
    """Rank ``absent`` never calls the search; the others must time out with a clear error."""
    if rank == case["absent"]:
        time.sleep(case["sleep_s"])
        return None
    return _knn_case(case, rank)


def _kmeans_case(case: dict[str, Any], rank: int) -> Any:
    from pytorch_metric_learning.evaluation import load_kmeans_func

    x = shard(case["x"], case["counts"], rank)
    kmeans = load_kmeans_func({"name": "torch_distributed", **case.get("options", {})})
    clusters = (
        case["num_clusters"][rank]
        if isinstance(case["num_clusters"], list)
        else case["num_clusters"]
    )
    return kmeans(x, clusters)


def _label_counts_case(case: dict[str, Any], rank: int) -> Any:
    from pytorch_metric_learning.evaluation.distributed._collectives import resolve_comm
    from pytorch_metric_learning.evaluation.distributed._labels import (
        global_label_counts,
        index_in,
    )

    labels = shard(case["labels"], case["counts"], rank)
    comm = resolve_comm(None, None, labels.device)
    unique, counts = global_label_counts(comm, labels, "test")
    return unique, counts, index_in(unique, labels)


def same_half(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A custom label comparison: labels 0-1, 2-3, ... match each other."""
    return (a // 2) == (b // 2)


COMPARISONS = {"same_half": same_half}


def accuracy_shards(case: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's ``get_accuracy`` arguments for an accuracy case."""
    counts = case["query_counts"]
    arguments = {
        "query": shard(case["query"], counts, rank),
        "query_labels": shard(case["query_labels"], counts, rank),
    }
    if case.get("rest") is not None:
        arguments["reference"] = _reference_shard(case, rank, "query", "rest")
        arguments["reference_labels"] = _reference_shard(case, rank, "query_labels", "rest_labels")
        arguments["ref_includes_query"] = case["ref_includes_query"]
    return arguments


def _accuracy_case(case: dict[str, Any], rank: int) -> Any:
    import warnings

    from pytorch_metric_learning.evaluation.distributed import DistributedAccuracyCalculator

    options = dict(case["calc"])
    if "comparison" in case:
        options["label_comparison_fn"] = COMPARISONS[case["comparison"]]
    if "fail_on_rank" in case and rank == case["fail_on_rank"]:
        options["knn_func"] = _raising_knn
    arguments = accuracy_shards(case, rank)
    if "labels_dtype_on_rank" in case and rank == case["labels_dtype_on_rank"][0]:
        for key in ("query_labels", "reference_labels"):
            if key in arguments:
                arguments[key] = arguments[key].to(case["labels_dtype_on_rank"][1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calculator = DistributedAccuracyCalculator(**options)
        result = calculator.get_accuracy(**arguments, **case.get("call", {}))
    return result, [str(warning.message) for warning in caught]


def _raising_knn(
    query: torch.Tensor, k: int, reference: torch.Tensor | None = None, ref: bool = False
) -> Any:
    raise RuntimeError("injected failure in the local search")


_GROUPS: dict[tuple[int, ...], Any] = {}


def _group(case: dict[str, Any]) -> Any:
    ranks = case.get("group_ranks")
    if ranks is None:
        return None
    key = tuple(ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


RUNNERS: dict[str, Callable[[dict[str, Any], int], Any]] = {
    "knn": _knn_case,
    "absent_rank": _absent_rank_case,
    "kmeans": _kmeans_case,
    "label_counts": _label_counts_case,
    "accuracy": _accuracy_case,
}
