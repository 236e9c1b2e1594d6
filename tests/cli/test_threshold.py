"""``pml-eval threshold`` on files of every format, checked against the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation import (
    equal_error_rate,
    match_accuracy,
    match_balanced_accuracy,
    match_f1,
    recall_at_false_match_rate,
    select_threshold,
)

from .conftest import assert_one_error
from .test_loaders import write

FORMATS = [".npy", ".npz", ".pt", ".csv"]


@pytest.fixture
def pairs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    same = rng.random(400) < 0.3
    distances = np.where(same, rng.normal(0.4, 0.2, 400), rng.normal(1.0, 0.3, 400))
    return distances, same


def write_pairs(folder: Path, pairs, suffix: str) -> tuple[Path, Path]:
    """The fixture's distances and match labels, written as ``s{suffix}`` and ``l{suffix}``."""
    distances, same = pairs
    return write(folder / f"s{suffix}", distances), write(folder / f"l{suffix}", same)


def _json(result) -> dict:
    assert result.code == 0, result.err
    return json.loads(result.out)


def brute_force_best_f1(scores: np.ndarray, same: np.ndarray) -> float:
    """The best F1 over thresholds at every score (distance rule: match when <= threshold)."""
    best = 0.0
    for threshold in scores:
        decided = scores <= threshold
        tp = np.sum(decided & same)
        fp = np.sum(decided & ~same)
        fn = np.sum(~decided & same)
        best = max(best, 2 * tp / (2 * tp + fp + fn))
    return float(best)


@pytest.mark.parametrize("suffix", FORMATS)
def test_default_f1_matches_the_api(cli, tmp_path: Path, pairs, suffix: str) -> None:
    distances, same = pairs
    scores_file = write(tmp_path / f"scores{suffix}", distances)
    labels_file = write(tmp_path / f"labels{suffix}", same.astype(np.int64))
    record = _json(cli("threshold", scores_file, "--labels", labels_file, "--output", "-"))
    expected = select_threshold(
        torch.from_numpy(distances), torch.from_numpy(same), match_f1, is_inverted=False
    )
    assert record["threshold"] == expected.threshold
    assert record["value"] == expected.value
    assert record["value"] == pytest.approx(brute_force_best_f1(distances, same))
    assert record["metric"] == "f1" and record["is_inverted"] is False
    assert record["num_pairs"] == 400 and record["num_matching"] == int(same.sum())
    assert record["equal_error_rate"] == equal_error_rate(
        torch.from_numpy(distances), torch.from_numpy(same), is_inverted=False
    )


@pytest.mark.parametrize(
    ("option", "metric"),
    [
        ("accuracy", match_accuracy),
        ("balanced_accuracy", match_balanced_accuracy),
        ("tar@far=0.05", recall_at_false_match_rate(0.05)),
        ("tar@far=5%", recall_at_false_match_rate(0.05)),
    ],
)
def test_other_metrics_on_similarities(cli, tmp_path: Path, pairs, option: str, metric) -> None:
    distances, same = pairs
    similarities = -distances
    scores_file = write(tmp_path / "s.npy", similarities)
    labels_file = write(tmp_path / "l.npy", same)
    record = _json(
        cli("threshold", scores_file, "--labels", labels_file, "--similarity",
            "--metric", option, "--output", "-")
    )  # fmt: skip
    expected = select_threshold(
        torch.from_numpy(similarities), torch.from_numpy(same), metric, is_inverted=True
    )
    assert (record["threshold"], record["value"]) == tuple(expected)
    assert record["is_inverted"] is True


def test_decisions_at_the_threshold(cli, tmp_path: Path) -> None:
    scores_file = tmp_path / "pairs.csv"
    scores_file.write_text("distance\n0.1\n0.2\n0.3\n0.9\n1.0\n")
    labels_file = tmp_path / "same.csv"
    labels_file.write_text("true\ntrue\nfalse\ntrue\nfalse\n")
    record = _json(
        cli(
            "threshold",
            scores_file,
            "--labels",
            labels_file,
            "--metric",
            "accuracy",
            "--output",
            "-",
        )
    )
    # Matching the two smallest distances gets 4 of 5 right; so does matching all but the last,
    # but ties go to the fewest matches: the midpoint between 0.2 and 0.3.
    assert record["threshold"] == pytest.approx(0.25)
    assert record["value"] == pytest.approx(0.8)
    rates = record["at_threshold"]
    assert (rates["true_positives"], rates["false_positives"]) == (2, 0)
    assert (rates["true_negatives"], rates["false_negatives"]) == (2, 1)


def test_table_and_json_file(cli, tmp_path: Path, pairs) -> None:
    scores_file, labels_file = write_pairs(tmp_path, pairs, ".npz")
    out = tmp_path / "out" / "threshold.json"
    result = cli("threshold", scores_file, "--labels", labels_file, "--output", out)
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    threshold_row = next(line for line in result.out.splitlines() if line.startswith("threshold"))
    assert threshold_row.split() == ["threshold", f"{record['threshold']:.4f}"]
    assert "400 pairs" in result.out and "<= the threshold" in result.out


def test_plot(cli, tmp_path: Path, pairs) -> None:
    pytest.importorskip("matplotlib")
    scores_file, labels_file = write_pairs(tmp_path, pairs, ".npy")
    plot = tmp_path / "plots" / "threshold.png"
    result = cli("threshold", scores_file, "--labels", labels_file, "--plot", plot)
    assert result.code == 0, result.err
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 1000
    assert f"Plot written to {plot}" in result.out


@pytest.mark.parametrize("similarity", [False, True])
def test_plot_title_says_what_the_scores_are(
    cli, tmp_path: Path, pairs, monkeypatch: pytest.MonkeyPatch, similarity: bool
) -> None:
    pytest.importorskip("matplotlib")
    from pytorch_metric_learning import plots

    titles: list[str | None] = []
    original = plots.plot_verification

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        titles.append(kwargs.get("title"))
        return original(*args, **kwargs)

    monkeypatch.setattr(plots, "plot_verification", spy)
    distances, same = pairs
    scores_file = write(tmp_path / "s.npy", -distances if similarity else distances)
    labels_file = write(tmp_path / "l.npy", same)
    extra = ["--similarity"] if similarity else []
    result = cli(
        "threshold", scores_file, "--labels", labels_file, "--plot", tmp_path / "p.png", *extra
    )
    assert result.code == 0, result.err
    kind = "similarities, larger" if similarity else "distances, smaller"
    matching = int(np.asarray(same).sum())
    assert titles == [
        f"{len(distances)} pairs of s.npy, {matching} should match (scores: {kind} = more alike)"
    ]


def test_one_npz_with_scores_and_labels(cli, tmp_path: Path, pairs) -> None:
    distances, same = pairs
    path = tmp_path / "pairs.npz"
    np.savez(path, scores=distances, labels=same)
    record = _json(cli("threshold", path, "--labels", path, "--output", "-"))
    assert record["value"] == pytest.approx(brute_force_best_f1(distances, same))


ERRORS = [
    (
        ("threshold", "missing.npy", "--labels", "{labels}"),
        1,
        "The scores file 'missing.npy' does not exist.",
    ),
    (
        ("threshold", "{matrix}", "--labels", "{labels}"),
        1,
        "must be a 1-D array (one per row). Got shape (10, 2)",
    ),
    (
        ("threshold", "{scores}", "--labels", "{short}"),
        1,
        "have 3 rows but the data they label has 10",
    ),
    (("threshold", "{scores}", "--labels", "{all_true}"), 1, "must contain both True and False"),
    (("threshold", "{scores}", "--labels", "{words}"), 1, "must say whether each pair matches"),
    (
        ("threshold", "{scores}", "--labels", "{labels}", "--metric", "tar@far=2"),
        2,
        "argument --metric: must be f1, accuracy",
    ),
    (
        ("threshold", "{scores}", "--labels", "{labels}", "--metric", "precision"),
        2,
        "Got 'precision' instead",
    ),
    (("threshold", "{scores}"), 2, "the following arguments are required: --labels"),
]


@pytest.mark.parametrize(("argv", "code", "message"), ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors(cli, tmp_path: Path, argv, code: int, message: str) -> None:
    files = {
        "scores": write(tmp_path / "scores.npy", np.linspace(0, 1, 10)),
        "labels": write(tmp_path / "labels.npy", np.arange(10) % 2 == 0),
        "matrix": write(tmp_path / "matrix.npy", np.zeros((10, 2))),
        "short": write(tmp_path / "short.npy", np.array([True, False, True])),
        "all_true": write(tmp_path / "all_true.npy", np.ones(10, dtype=bool)),
    }
    files["words"] = tmp_path / "words.csv"
    files["words"].write_text("yes\n" * 9 + "perhaps\n")
    result = cli(*(arg.format(**files) for arg in argv))
    assert_one_error(result, code, message)
