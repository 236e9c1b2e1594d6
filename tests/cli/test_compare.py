"""``pml-eval evaluate --ci`` and ``pml-eval compare``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .test_loaders import write


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A good model (classes apart) and a poor one (mostly noise) of the same 300 queries."""
    rng = np.random.default_rng(5)
    labels = np.arange(300) % 6
    good = rng.normal(size=(300, 8)) + 2.5 * np.eye(8)[labels]
    poor = rng.normal(size=(300, 8)) + 0.3 * np.eye(8)[labels]
    return {
        "good": write(tmp_path / "good.npy", good.astype(np.float32)),
        "poor": write(tmp_path / "poor.npy", poor.astype(np.float32)),
        "labels": write(tmp_path / "labels.npy", labels),
        "short": write(tmp_path / "short.npy", good[:50].astype(np.float32)),
    }


def _recall_at(embeddings: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Leave-one-out Recall@k by brute force."""
    dist = ((embeddings[:, None, :] - embeddings[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(dist, np.inf)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return float(np.mean([(labels[row] == labels[i]).any() for i, row in enumerate(order)]))


def test_evaluate_ci_adds_intervals_to_the_json(cli, files) -> None:
    result = cli("evaluate", files["good"], "--labels", files["labels"], "--metrics",
                 "recall_at_1,recall_at_4,NMI", "--ci", "95", "--output", "-")  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(result.out)
    embeddings, labels = np.load(files["good"]).astype(np.float64), np.load(files["labels"])
    for k in (1, 4):
        name = f"recall_at_{k}"
        interval = record["intervals"][name]
        assert record["metrics"][name] == pytest.approx(_recall_at(embeddings, labels, k))
        assert interval["low"] <= interval["value"] <= interval["high"]
        assert interval["level"] == 0.95
    assert "NMI" in record["metrics"] and "NMI" not in record["intervals"]
    assert record["settings"]["bootstrap"] == {
        "level": 0.95, "resamples": 1000, "seed": 0, "resample": "queries", "method": "auto"
    }  # fmt: skip


def test_evaluate_ci_table_has_an_interval_column(cli, files) -> None:
    result = cli("evaluate", files["poor"], "--labels", files["labels"], "--metrics",
                 "precision_at_1,AMI", "--ci", "90", "--ci-by-class")  # fmt: skip
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert any("90% interval" in line for line in lines)
    row = next(line for line in lines if line.startswith("precision_at_1"))
    low, high = (float(part) for part in row.split("[")[1].rstrip("]").split(","))
    value = float(row.split()[1])
    assert low <= value <= high
    assert next(line for line in lines if line.startswith("AMI")).count("[") == 0


def test_evaluate_without_ci_is_unchanged(cli, files) -> None:
    record = json.loads(cli("evaluate", files["good"], "--labels", files["labels"],
                            "--output", "-").out)  # fmt: skip
    assert "intervals" not in record and "per_query" not in record["metrics"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ci", "0"], "percentage"),
        (["--ci", "0.95"], "percentage"),
        (["--ci", "100"], "percentage"),
        (["--ci", "95", "--per-class"], "--per-class"),
        (["--ci", "95", "--avg-of-avgs"], "--avg-of-avgs"),
        (["--metrics", "recall_at_0"], "recall_at_<K>"),
        (["--resamples", "0"], "positive int"),
    ],
)
def test_evaluate_ci_usage_errors(cli, files, extra, message) -> None:
    result = cli("evaluate", files["good"], "--labels", files["labels"], *extra)
    assert result.code == 2
    assert message in result.err


def test_compare_reports_both_models_and_the_difference(cli, files) -> None:
    result = cli("compare", files["poor"], files["good"], "--labels", files["labels"],
                 "--metrics", "recall_at_1,recall_at_2", "--output", "-")  # fmt: skip
    assert result.code == 0, result.err
    compared = json.loads(result.out)["comparison"]
    labels = np.load(files["labels"])
    poor, good = (np.load(files[name]).astype(np.float64) for name in ("poor", "good"))
    for k in (1, 2):
        row = compared[f"recall_at_{k}"]
        assert row["a"] == pytest.approx(_recall_at(poor, labels, k))
        assert row["b"] == pytest.approx(_recall_at(good, labels, k))
        assert row["difference"] == pytest.approx(row["b"] - row["a"])
        assert row["low"] <= row["difference"] <= row["high"]
        assert row["p_value"] < 0.01


def test_compare_the_other_way_round_is_not_significant(cli, files) -> None:
    result = cli("compare", files["good"], files["poor"], "--labels", files["labels"])
    assert result.code == 0, result.err
    assert "B - A" in result.out and "p" in result.out.split("\n")[3]
    for name in ("precision_at_1", "r_precision", "mean_average_precision_at_r"):
        row = next(line for line in result.out.splitlines() if line.startswith(name + " "))
        assert float(row.split()[-1]) > 0.99


def test_compare_against_one_shared_reference(cli, files) -> None:
    result = cli("compare", files["poor"], files["good"], "--labels", files["labels"],
                 "--reference", files["good"], "--reference-labels", files["labels"],
                 "--metrics", "recall_at_1", "--output", "-")  # fmt: skip
    assert result.code == 0, result.err
    row = json.loads(result.out)["comparison"]["recall_at_1"]
    labels = np.load(files["labels"])
    poor, good = (np.load(files[name]).astype(np.float64) for name in ("poor", "good"))
    for value, query in ((row["a"], poor), (row["b"], good)):
        dist = ((query[:, None, :] - good[None, :, :]) ** 2).sum(-1)
        nearest = dist.argmin(axis=1)
        assert value == pytest.approx(float(np.mean(labels[nearest] == labels)))


def test_compare_with_references_by_class(cli, files, tmp_path: Path) -> None:
    result = cli("compare", files["poor"], files["good"], "--labels", files["labels"],
                 "--reference", files["poor"], files["good"], "--reference-labels",
                 files["labels"], "--ref-includes-query", "--ci-by-class", "--output",
                 tmp_path / "out" / "c.json")  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads((tmp_path / "out" / "c.json").read_text())
    assert record["settings"]["bootstrap"]["resample"] == "classes"
    assert record["comparison"]["precision_at_1"]["p_value"] < 0.05


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["good", "short", "--labels", "labels"], 1, "have 300 rows"),
        (["good", "poor", "--labels", "labels", "--metrics", "NMI"], 2, "unknown metric"),
        (["good", "poor", "--labels", "labels", "--reference", "good", "poor"], 2, "together"),
        (
            [
                "good",
                "poor",
                "--labels",
                "labels",
                "--reference",
                "good",
                "poor",
                "good",
                "--reference-labels",
                "labels",
            ],
            2,
            "one file or two",
        ),
        (["good", "poor", "--labels", "short"], 1, ""),
    ],
)
def test_compare_errors(cli, files, argv, code, message) -> None:
    result = cli("compare", *[files.get(arg, arg) for arg in argv])
    assert result.code == code
    assert message in result.err
