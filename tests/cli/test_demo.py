"""``pml-eval demo --quick`` finishes, writes its files, and its numbers can be reproduced."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.cli import main
from pytorch_metric_learning.cli.demo import load_digit_splits, supervised_contrastive_loss
from pytorch_metric_learning.evaluation.search._install_hint import extra_install_hint

pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow


@dataclass
class DemoRun:
    code: int
    out: str
    err: str
    folder: Path
    results: dict


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    folder = tmp_path_factory.mktemp("demo") / "out"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["demo", "--quick", "--output", str(folder)])
    results = json.loads((folder / "results.json").read_text()) if code == 0 else {}
    return DemoRun(code, out.getvalue(), err.getvalue(), folder, results)


def test_finishes_and_writes_its_files(quick_demo: DemoRun) -> None:
    assert quick_demo.code == 0, quick_demo.err
    folder = quick_demo.folder
    expected = [
        "results.json",
        "val_embeddings.npz",
        "test_embeddings.npz",
        "val_pairs.npz",
        "test_pairs.npz",
        "logs/records.db",
    ]
    for name in expected:
        assert (folder / name).is_file(), name
    best = quick_demo.results["best_epoch"]
    assert (folder / "models" / f"trunk_best{best}.pth").is_file()
    assert (folder / "models" / f"embedder_best{best}.pth").is_file()
    assert quick_demo.results["epochs_run"] == 2


def test_writes_plots(quick_demo: DemoRun) -> None:
    pytest.importorskip("matplotlib")
    for name in ("training_curves.png", "threshold.png"):
        data = (quick_demo.folder / "plots" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_summary_says_where_everything_is(quick_demo: DemoRun) -> None:
    for path in quick_demo.results["files"].values():
        assert path in quick_demo.out
    assert "precision_at_1" in quick_demo.out
    assert "Verification threshold" in quick_demo.out
    assert "since pml-eval started (" in quick_demo.out  # says what the time measures


def test_results_are_plausible(quick_demo: DemoRun) -> None:
    results = quick_demo.results
    assert set(results["test"]) == {
        "AMI",
        "NMI",
        "mean_average_precision_at_r",
        "precision_at_1",
        "r_precision",
    }
    # Even two epochs separate the digits far better than chance (0.1).
    assert results["test"]["precision_at_1"] > 0.8
    assert 0.0 <= results["threshold"]["test"]["false_match_rate"] <= 1.0


def test_test_table_is_reproduced_by_evaluate(quick_demo: DemoRun, cli) -> None:
    embeddings = quick_demo.folder / "test_embeddings.npz"
    result = cli("evaluate", embeddings, "--labels", embeddings, "--output", "-")
    assert result.code == 0, result.err
    assert json.loads(result.out)["metrics"] == pytest.approx(quick_demo.results["test"])


def test_precision_at_1_by_brute_force(quick_demo: DemoRun) -> None:
    with np.load(quick_demo.folder / "test_embeddings.npz") as data:
        embeddings, labels = data["embeddings"].astype(np.float64), data["labels"]
    distances = ((embeddings[:, None, :] - embeddings[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    expected = float(np.mean(labels[nearest] == labels))
    assert quick_demo.results["test"]["precision_at_1"] == pytest.approx(expected)


def test_threshold_is_reproduced_by_the_threshold_command(quick_demo: DemoRun, cli) -> None:
    pairs = quick_demo.folder / "val_pairs.npz"
    result = cli("threshold", pairs, "--labels", pairs, "--similarity", "--output", "-")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert record["threshold"] == quick_demo.results["threshold"]["threshold"]
    assert record["value"] == quick_demo.results["threshold"]["validation_f1"]


def test_test_pair_decisions(quick_demo: DemoRun) -> None:
    threshold = quick_demo.results["threshold"]
    with np.load(quick_demo.folder / "test_pairs.npz") as data:
        scores, same = data["scores"], data["labels"]
    decided = scores >= threshold["threshold"]
    assert len(scores) == threshold["test_pairs"]
    assert threshold["test"]["accuracy"] == pytest.approx(np.mean(decided == same))
    assert threshold["test"]["true_match_rate"] == pytest.approx(np.mean(decided[same]))
    assert threshold["test"]["false_match_rate"] == pytest.approx(np.mean(decided[~same]))


def test_splits_are_disjoint_and_stratified() -> None:
    splits = load_digit_splits(seed=0)
    sizes = {name: len(dataset) for name, dataset in splits.items()}
    assert sum(sizes.values()) == 1797
    rows = {
        name: {tuple(x.tolist()) for x in dataset.tensors[0]} for name, dataset in splits.items()
    }
    # The digits data set has a few exact duplicate images; allow no more overlap than that.
    assert len(rows["train"] & rows["test"]) < 5
    for dataset in splits.values():
        counts = torch.bincount(dataset.tensors[1], minlength=10).float()
        share = counts / counts.sum()
        assert bool((share - 0.1).abs().max() < 0.02)


def test_loss_against_a_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(6, 3, generator=generator)
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    unit = embeddings / embeddings.norm(dim=1, keepdim=True)
    terms = []
    for i in range(6):
        others = [j for j in range(6) if j != i]
        positives = [j for j in others if labels[j] == labels[i]]
        if not positives:
            continue
        denominator = sum(torch.exp(unit[i] @ unit[j] / 0.1) for j in others)
        terms.append(
            sum(-torch.log(torch.exp(unit[i] @ unit[p] / 0.1) / denominator) for p in positives)
            / len(positives)
        )
    expected = torch.stack(terms).mean()
    assert torch.allclose(supervised_contrastive_loss(embeddings, labels), expected)


def test_without_scikit_learn(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    result = cli("demo", "--quick", "--output", tmp_path / "demo")
    assert result.code == 1
    assert result.err.count("\n") == 1
    assert extra_install_hint("demo") in result.err  # the hint itself: test_install_hint.py


def test_epochs_must_be_positive(cli) -> None:
    result = cli("demo", "--epochs", "0")
    assert result.code == 2
    assert "argument --epochs: must be a positive int" in result.err


def test_a_second_run_replaces_the_first(cli, tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    first = cli("demo", "--epochs", "2", "--no-plots", "--output", folder)
    assert first.code == 0, first.err
    users = {  # a user's files inside the demo's folders: not the demo's names, they stay
        folder / "models" / "resnet_50.pth": b"pretrained",
        folder / "models" / "trunk.pth": b"mine",
        folder / "logs" / "my_notes.txt": b"notes",
        folder / "logs" / "records.db.bak": b"backup",
        folder / "plots" / "my_plot.png": b"png",
    }
    for path, data in users.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    second = cli("demo", "--epochs", "1", "--no-plots", "--output", folder)
    assert second.code == 0, second.err
    results = json.loads((folder / "results.json").read_text())
    assert results["epochs_run"] == 1 and results["best_epoch"] == 1
    assert {path: path.read_bytes() for path in users} == users
    # The first run's records and checkpoints are gone: one epoch of history, one checkpoint.
    history = (folder / "logs" / "accuracies_val" / "precision_at_1_level0.csv").read_text()
    assert len(history.strip().splitlines()) == 2  # the header and epoch 1
    assert sorted(p.name for p in (folder / "models").glob("trunk_*")) == [
        "trunk_1.pth",
        "trunk_best1.pth",
        "trunk_optimizer_1.pth",
        "trunk_optimizer_best1.pth",
    ]


def test_a_foreign_folder_is_left_alone(cli, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    (folder / "models").mkdir(parents=True)
    (folder / "models" / "precious.pth").write_text("keep me")
    result = cli("demo", "--quick", "--output", folder)
    assert result.code == 1
    assert "already holds 'models', which the demo did not write" in result.err
    assert (folder / "models" / "precious.pth").read_text() == "keep me"
    overwritten = cli("demo", "--epochs", "1", "--no-plots", "--overwrite", "--output", folder)
    assert overwritten.code == 0, overwritten.err
    # --overwrite replaces the demo's own files only: a user's file there stays
    assert (folder / "models" / "precious.pth").read_text() == "keep me"


def test_a_foreign_folder_is_refused_before_torch_and_training(tmp_path: Path) -> None:
    """The refusal comes first: no announcement of training, torch not even imported."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    code = (
        "import sys\nfrom pytorch_metric_learning.cli import main\n"
        f"code = main(['demo', '--quick', '--output', {str(folder)!r}])\n"
        "print('torch' in sys.modules, code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "1"], (done.stdout, done.stderr)
    assert "already holds 'results.json', which the demo did not write" in done.stderr
    assert (folder / "results.json").read_text() == "{}"


def test_an_output_inside_a_file_is_refused_before_training(cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = cli("demo", "--quick", "--output", tmp_path / "file" / "demo")
    assert result.code == 1
    assert "cannot be created" in result.err and "Training" not in result.out


def test_next_steps_run_as_printed(quick_demo: DemoRun) -> None:
    """The commands the summary suggests work when pasted (no venv activation needed)."""
    import shlex
    import subprocess

    lines = quick_demo.out.split("from the command line:")[1].strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        done = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stderr)


def test_recall_at_k_with_intervals(quick_demo: DemoRun) -> None:
    with np.load(quick_demo.folder / "test_embeddings.npz") as data:
        embeddings, labels = data["embeddings"].astype(np.float64), data["labels"]
    distances = ((embeddings[:, None, :] - embeddings[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(distances, np.inf)
    order = np.argsort(distances, axis=1, kind="stable")
    recall = quick_demo.results["test_recall"]
    assert list(recall) == ["recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8"]
    for name, interval in recall.items():
        k = int(name.rsplit("_", 1)[1])
        hits = [(labels[row[:k]] == labels[i]).any() for i, row in enumerate(order)]
        assert interval["value"] == pytest.approx(float(np.mean(hits)))
        assert interval["low"] <= interval["value"] <= interval["high"]
    assert "Recall@K" in quick_demo.out and "recall_at_8" in quick_demo.out
