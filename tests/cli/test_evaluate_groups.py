"""``pml-eval evaluate --query-groups FILE --reference-groups FILE``: the re-ID protocol."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation.retrieval.accuracy_calculator import AccuracyCalculator

from .test_loaders import write


@pytest.fixture
def cameras() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 30)
    reference_labels = rng.integers(0, 5, 50)
    return {
        "query": (rng.normal(size=(30, 4)) + labels[:, None]).astype(np.float32),
        "labels": labels,
        "reference": (rng.normal(size=(50, 4)) + reference_labels[:, None]).astype(np.float32),
        "ref_labels": reference_labels,
        "query_groups": rng.integers(0, 3, 30),
        "ref_groups": rng.integers(0, 3, 50),
    }


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
def test_groups_pass_through_to_the_calculator(cli, tmp_path: Path, cameras, suffix) -> None:
    paths = {name: write(tmp_path / f"{name}{suffix}", array) for name, array in cameras.items()}
    metrics = "recall_at_1,recall_at_5,mean_average_precision,mean_inverse_negative_penalty"
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--query-groups", paths["query_groups"], "--reference-groups", paths["ref_groups"],
        "--metrics", metrics, "--output", "-",
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(result.out)
    calculator = AccuracyCalculator(include=tuple(metrics.split(",")))
    tensors = {name: torch.from_numpy(array) for name, array in cameras.items()}
    expected = calculator.get_accuracy(
        tensors["query"],
        tensors["labels"],
        tensors["reference"],
        tensors["ref_labels"],
        query_groups=tensors["query_groups"],
        reference_groups=tensors["ref_groups"],
    )
    without = calculator.get_accuracy(
        tensors["query"], tensors["labels"], tensors["reference"], tensors["ref_labels"]
    )
    assert record["metrics"] == pytest.approx(expected)
    assert record["metrics"] != pytest.approx(without)  # the groups changed something
    assert record["settings"]["query_groups"] == str(paths["query_groups"])
    assert record["settings"]["queries_left_out"] == calculator.last_num_queries_left_out


def test_single_gallery_shot_passes_through(cli, tmp_path: Path, cameras) -> None:
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in cameras.items()}
    metrics = "recall_at_1,recall_at_5,mean_average_precision"
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--query-groups", paths["query_groups"], "--reference-groups", paths["ref_groups"],
        "--single-gallery-shot", "--metrics", metrics, "--output", "-",
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(result.out)
    tensors = {name: torch.from_numpy(array) for name, array in cameras.items()}
    arguments = (tensors["query"], tensors["labels"], tensors["reference"], tensors["ref_labels"])
    groups = {"query_groups": tensors["query_groups"], "reference_groups": tensors["ref_groups"]}
    calculator = AccuracyCalculator(include=tuple(metrics.split(",")))
    expected = calculator.get_accuracy(*arguments, **groups, single_gallery_shot=True)
    market = calculator.get_accuracy(*arguments, **groups)
    assert record["metrics"] == pytest.approx(expected)
    assert record["metrics"]["recall_at_5"] != pytest.approx(market["recall_at_5"])
    assert record["settings"]["single_gallery_shot"] is True


def test_reference_groups_need_query_groups(cli, tmp_path: Path, cameras) -> None:
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in cameras.items()}
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--reference-groups", paths["ref_groups"],
    )  # fmt: skip
    assert result.code != 0
    assert "--query-groups and --reference-groups must be given together" in result.err


def test_groups_of_the_wrong_length_are_named(cli, tmp_path: Path, cameras) -> None:
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in cameras.items()}
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--query-groups", paths["ref_groups"],
    )  # fmt: skip
    assert result.code != 0
    assert "ref_groups.npy" in result.err


@pytest.mark.parametrize("single_shot", [False, True])
def test_show_worst_shows_only_the_candidates_the_metrics_used(
    cli, tmp_path: Path, cameras, single_shot
) -> None:
    """--show-worst under --query-groups (and --single-gallery-shot): no same-label,
    same-camera reference is shown, ranks count candidates, values are the metric's."""
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in cameras.items()}
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--query-groups", paths["query_groups"], "--reference-groups", paths["ref_groups"],
        "--metrics", "precision_at_1", "--show-worst", "30", "--worst-k", "50",
        *(["--single-gallery-shot"] if single_shot else []), "--output", "-",
    )  # fmt: skip
    assert result.code == 0, result.err
    queries = json.loads(result.out)["worst_queries"]["queries"]
    assert queries
    query, reference = cameras["query"], cameras["reference"]
    for item in queries:
        q = item["index"]
        label, camera = cameras["labels"][q], cameras["query_groups"][q]
        candidates = [
            j
            for j in range(len(reference))
            if not (cameras["ref_labels"][j] == label and cameras["ref_groups"][j] == camera)
        ]
        distances = ((reference[candidates] - query[q]) ** 2).sum(axis=1)
        order = [candidates[i] for i in np.argsort(distances, kind="stable")]
        shown = [retrieval["index"] for retrieval in item["retrievals"]]
        assert shown == order[: len(shown)] and len(shown) == min(50, len(order))
        relevant = [bool(cameras["ref_labels"][j] == label) for j in order]
        assert [r["relevant"] for r in item["retrievals"]] == relevant[: len(shown)]
        if not single_shot:
            assert item["value"] == float(relevant[0])


def test_category_counts_leave_out_the_queries_the_overall_count_leaves_out(
    cli, tmp_path: Path, cameras
) -> None:
    """Per category, "queries" are those its metrics average over and "left out" the
    others (no valid relevant reference), as the overall count: they add up to both."""
    arrays = dict(cameras)
    arrays["ref_groups"] = np.zeros(50, dtype=np.int64)  # one camera: many queries left out
    arrays["query_groups"] = np.zeros(30, dtype=np.int64)
    arrays["ref_labels"] = np.where(np.arange(50) < 25, arrays["ref_labels"], 9)
    arrays["query_groups"][::2] = 1
    arrays["categories"] = np.arange(30) % 3
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in arrays.items()}
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--query-groups", paths["query_groups"], "--reference-groups", paths["ref_groups"],
        "--query-categories", paths["categories"], "--metrics", "precision_at_1",
        "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    scored, left_out = record["per_category_queries"], record["per_category_queries_left_out"]
    # the oracle: a query is left out when no reference of its label has another camera
    expected_left = {str(c): 0 for c in range(3)}
    for q in range(30):
        label, camera = arrays["labels"][q], arrays["query_groups"][q]
        valid = (arrays["ref_labels"] == label) & (arrays["ref_groups"] != camera)
        expected_left[str(q % 3)] += int(not valid.any())
    assert left_out == expected_left and sum(left_out.values()) > 0
    assert {c: scored[c] + left_out[c] for c in scored} == {str(c): 10 for c in range(3)}
    assert sum(left_out.values()) == record["settings"]["queries_left_out"]
    header = next(line for line in result.out.splitlines() if line.startswith("category"))
    assert header.split()[:4] == ["category", "queries", "left", "out"]
