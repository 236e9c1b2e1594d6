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


def scaled(case: dict[str, Any], factor: float) -> dict[str, Any]:
    """Multiply the case's rows by ``factor``."""
    case["query"] = case["query"] * factor
    if case["rest"] is not None:
        case["rest"] = case["rest"] * factor
    return case


def tied(case: dict[str, Any]) -> dict[str, Any]:
    """Round the rows to -1, 0 or 1: many exact ties, broken by global reference index."""
    case["query"] = case["query"].round().clamp(-1, 1)
    if case["rest"] is not None:
        case["rest"] = case["rest"].round().clamp(-1, 1)
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
        tied(knn_case("ties", uneven, others, k=6)),
        tied(
            knn_case(
                "ties_self",
                _first([4, 6, 0], world),
                _first([3, 0, 8], world),
                k=5,
                ref_includes_query=True,
            )
        ),
        scaled(knn_case("scaled_up", uneven, others, k=4), 2.0**70),  # distances overflow
        scaled(knn_case("scaled_down", uneven, others, k=4), 2.0**-80),  # and underflow
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
        kmeans_case(
            "kmeans_sampled",
            counts,
            overlapping,
            4,
            options={"max_points_per_centroid": 5, "init_size": 8, "n_init": 2},
        ),
        kmeans_case(
            "kmeans_scaled",  # squared distances overflow float32; rank 0's rows are tiny
            counts,
            overlapping
            * torch.where(torch.arange(sum(counts)) < counts[0], 2.0**50, 2.0**90)[:, None],
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


ALL_METRICS = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "recall_at_3",
    "precision_at_2",
    "mean_average_precision_at_4",
    "ndcg_at_5",
    "NMI",
    "AMI",
)
KNN_METRICS = ALL_METRICS[:9]


def accuracy_case(
    name: str,
    query_counts: list[int],
    rest_counts: list[int] | None,
    num_labels: int,
    calc: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """Overlapping clusters, one per label, with rest rows as the other reference rows."""
    case = knn_case(name, query_counts, rest_counts, kind="accuracy", calc=calc, **extra)
    generator = torch.Generator().manual_seed(len(name) + 101)
    case["query_labels"] = torch.randint(num_labels, (len(case["query"]),), generator=generator)
    case["query"] = case["query"] + 1.5 * torch.eye(DIMS)[case["query_labels"] % DIMS]
    if case["rest"] is not None:
        labels = torch.randint(num_labels, (len(case["rest"]),), generator=generator)
        case["rest_labels"] = labels
        case["rest"] = case["rest"] + 1.5 * torch.eye(DIMS)[labels % DIMS]
    return case


def clustering_case(name: str, counts: list[int], **extra: Any) -> dict[str, Any]:
    """Separated blobs whose labels are the blob ids, with a few labels changed."""
    x, blob = blobs(counts, 4, seed=29)
    labels = blob.clone()
    labels[4::9] = (labels[4::9] + 1) % 4
    case = {
        "name": name,
        "kind": "accuracy",
        "query": x,
        "query_labels": labels,
        "query_counts": counts,
        "rest": None,
        "ref_includes_query": False,
        "calc": {"include": ALL_METRICS},
    }
    case.update(extra)
    return case


def accuracy_plan(world: int) -> list[dict[str, Any]]:
    q = _first([13, 0, 17], world)
    r = _first([9, 14, 0], world)
    plan = [
        clustering_case("acc_clusters", _first([20, 0, 25], world)),
        accuracy_case("acc_self", _first([15, 6, 11], world), None, 6, {"include": KNN_METRICS}),
        accuracy_case(
            "acc_query_ref",
            q,
            r,
            7,
            {"include": KNN_METRICS, "k": "max_bin_count", "avg_of_avgs": True},
        ),
        accuracy_case(
            "acc_ref_includes",
            q,
            r,
            5,
            {"include": KNN_METRICS, "k": 3, "return_per_class": True},
            ref_includes_query=True,
        ),
        accuracy_case(
            "acc_custom",
            q,
            r,
            8,
            {"include": KNN_METRICS, "k": 6},
            comparison="same_half",
            ref_includes_query=True,
        ),
        accuracy_case("acc_defaults", q, r, 4, {}, ref_includes_query=True),
        accuracy_case(
            "acc_call_include",
            q,
            r,
            4,
            {},
            call={"include": ("precision_at_1", "mean_reciprocal_rank")},
        ),
        accuracy_case("acc_local_failure", q, r, 4, {"include": KNN_METRICS}, fail_on_rank=1),
        accuracy_case("acc_after_failure", q, r, 4, {"include": KNN_METRICS}),
        accuracy_case(
            "acc_dtype_mismatch",
            q,
            r,
            4,
            {"include": ("precision_at_1",)},
            labels_dtype_on_rank=(0, torch.int32),
        ),
    ]
    lone = accuracy_case(
        "acc_all_lone", q, r, 3, {"include": KNN_METRICS, "return_per_class": True}
    )
    lone["rest_labels"] = lone["rest_labels"] + 10
    two_d = accuracy_case("acc_label_rows", q, r, 4, {"include": ALL_METRICS[:3]})
    two_d["query_labels"] = torch.stack([two_d["query_labels"] // 2, two_d["query_labels"] % 2], 1)
    two_d["rest_labels"] = torch.stack([two_d["rest_labels"] // 2, two_d["rest_labels"] % 2], 1)
    return plan + [lone, two_d]


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
    return (
        knn_plan(world)
        + kmeans_plan(world)
        + label_counts_plan(world)
        + accuracy_plan(world)
        + absent_rank_plan(world)
    )
