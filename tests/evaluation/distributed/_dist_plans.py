"""The cases every spawned group runs, one plan per group size (one spawn per size)."""

from __future__ import annotations

from typing import Any

import torch

DIMS = 6


def knn_case(name: str, query_counts: list[int], rest_counts: list[int] | None, **extra: Any):
    """A k-NN case; ``rest`` are the reference rows that are not queries."""
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


def labelled(case: dict[str, Any], width: int | None = None) -> dict[str, Any]:
    """Give every query and rest row an integer label (rows of ``width`` labels if given)."""
    generator = torch.Generator().manual_seed(17)
    shape = () if width is None else (width,)
    case["query_labels"] = torch.randint(5, (len(case["query"]), *shape), generator=generator)
    if case["rest"] is not None:
        case["rest_labels"] = torch.randint(5, (len(case["rest"]), *shape), generator=generator)
    return case


def blobs(counts: list[int], num_blobs: int, seed: int, spread: float = 0.05):
    """Well separated blobs, rows in random blob order: ``(x, blob of each row)``."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_blobs, DIMS, generator=generator) * 10
    blob = torch.randint(num_blobs, (sum(counts),), generator=generator)
    blob[:num_blobs] = torch.arange(num_blobs)
    x = centers[blob] + spread * torch.randn(len(blob), DIMS, generator=generator)
    return x, blob


def kmeans_case(name: str, counts: list[int], x: torch.Tensor, num_clusters: Any, **extra: Any):
    return {
        "name": name,
        "kind": "kmeans",
        "x": x,
        "counts": counts,
        "num_clusters": num_clusters,
        **extra,
    }


def _first(values: list[Any], world: int) -> list[Any]:
    return values[:world]


def knn_plan(world: int) -> list[dict[str, Any]]:
    uneven = _first([5, 0, 9], world)
    others = _first([7, 11, 0], world)
    plan = [
        knn_case("plain", uneven, others, k=4),
        knn_case(
            "self", _first([4, 6, 0], world), _first([3, 0, 8], world), k=5, ref_includes_query=True
        ),
        knn_case("self_no_reference", uneven, None, k=3, ref_includes_query=True),
        knn_case("no_reference", uneven, None, k=2),
        knn_case(
            "cosine_all",
            uneven,
            others,
            k=sum(others),
            options={"knn_func": {"name": "custom", "distance": "cosine"}, "block_size": 2},
        ),
        knn_case("one_block", uneven, others, k=1, options={"block_size": 64}),
        labelled(knn_case("labels", uneven, others, k=3)),
        labelled(knn_case("labels_self", uneven, others, k=4, ref_includes_query=True), width=2),
        labelled(knn_case("labels_no_reference", uneven, None, k=2, ref_includes_query=True)),
        knn_case("k_mismatch", uneven, others, k=[3, 4, 3][:world]),
        knn_case("k_zero", uneven, others, k=0),
        knn_case("k_too_big", uneven, others, k=sum(others) + 1),
        knn_case("local_failure", uneven, others, k=2, fail_on_rank=1),
        knn_case("after_failure", uneven, others, k=2),
    ]
    if world == 3:
        plan.append(knn_case("subgroup", [4, 7], [6, 2], k=3, group_ranks=[0, 2]))
    return plan


KMEANS_COUNTS = {2: [30, 43], 3: [30, 0, 43]}


def kmeans_plan(world: int) -> list[dict[str, Any]]:
    counts = KMEANS_COUNTS[world]
    x, _ = blobs(counts, 5, seed=11)
    overlapping = torch.randn(sum(counts), DIMS, generator=torch.Generator().manual_seed(5))
    return [
        kmeans_case("kmeans_blobs", counts, x, 5),
        kmeans_case(
            "kmeans_overlapping",
            counts,
            overlapping,
            4,
            options={"init_size": 20, "n_init": 2, "tol": 0.0},
        ),
        kmeans_case("kmeans_mismatch", counts, x, [5, 4, 5][:world]),
        kmeans_case("kmeans_too_many", counts, x, sum(counts) + 1),
    ]


def label_counts_plan(world: int) -> list[dict[str, Any]]:
    counts = [9, 0, 14][:world]
    generator = torch.Generator().manual_seed(23)
    return [
        {
            "name": f"label_counts_{width}",
            "kind": "label_counts",
            "counts": counts,
            "labels": torch.randint(-3, 4, (sum(counts), *shape), generator=generator),
        }
        for width, shape in ((1, ()), (2, (2,)))
    ]


def absent_rank_plan(world: int) -> list[dict[str, Any]]:
    """Rank 1 never calls the search; this breaks the group, so it runs last."""
    if world != 2:
        return []
    case = knn_case(
        "absent",
        [3, 4],
        [5, 2],
        kind="absent_rank",
        k=2,
        absent=1,
        sleep_s=3,
        breaks_group=True,
        options={"timeout": 1.0},
    )
    return [case]


def full_plan(world: int) -> list[dict[str, Any]]:
    return knn_plan(world) + kmeans_plan(world) + label_counts_plan(world) + absent_rank_plan(world)
