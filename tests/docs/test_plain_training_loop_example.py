"""docs/examples/plain_training_loop.py runs, records, saves and resumes."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "plain_training_loop.py"


@pytest.fixture
def example() -> dict:
    return runpy.run_path(str(EXAMPLE))


def test_example_trains_and_resumes(tmp_path: Path, example: dict) -> None:
    hooks = example["main"](tmp_path, num_epochs=3, patience=None)
    history = hooks.get_accuracy_history(None, "val")
    assert history["epoch"] == [1, 2, 3]
    best_epoch, best = hooks.get_best_epoch_and_accuracy(None, "val")
    assert best == max(history["precision_at_1_level0"])
    assert best_epoch == 1 + history["precision_at_1_level0"].index(best)
    saved = sorted(p.name for p in (tmp_path / "saved_models").iterdir())
    assert saved == sorted(
        [
            "trunk_3.pth",
            "trunk_optimizer_3.pth",
            f"trunk_best{best_epoch}.pth",
            f"trunk_optimizer_best{best_epoch}.pth",
        ]
    )
    assert hooks.get_loss_history()["iteration"] == list(range(12))

    resumed = example["main"](tmp_path, num_epochs=5, patience=None)
    assert resumed.get_accuracy_history(None, "val")["epoch"] == [1, 2, 3, 4, 5]
    assert resumed.get_loss_history()["iteration"] == list(range(20))
    assert (tmp_path / "saved_models" / "trunk_5.pth").exists()


def test_example_as_a_script(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), str(tmp_path)])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert out.startswith("best epoch ") and "NMI_level0" in out
    assert (tmp_path / "logs" / "records.db").exists()


def folder_snapshot(root: Path) -> tuple[dict[str, bytes], list[tuple]]:
    """The checkpoint and CSV files' bytes and the records, read with plain sqlite3."""
    import sqlite3

    files = {str(p): p.read_bytes() for p in root.rglob("*") if p.suffix in (".pth", ".csv")}
    with sqlite3.connect(root / "logs" / "records.db") as conn:
        rows = sorted(conn.execute("SELECT record_group, name, step, value FROM records"))
    return files, rows


def test_example_folder_survives_a_wrong_resume(tmp_path: Path, example: dict) -> None:
    """Issue 12, defects 1 and 2, as reported: an extra scheduler, then a typo'd folder."""
    import torch

    from pytorch_metric_learning.errors import ResumeError
    from pytorch_metric_learning.utils import logging_presets

    example["main"](tmp_path, num_epochs=3, patience=None)
    before = folder_snapshot(tmp_path)
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(trunk.parameters(), lr=0.05)
    state = logging_presets.TrainingState(
        models={"trunk": trunk},
        optimizers={"trunk_optimizer": optimizer},
        lr_schedulers={"s": torch.optim.lr_scheduler.StepLR(optimizer, 1)},
    )
    with pytest.raises(ResumeError, match=r"\['s'\]"):
        hooks.load_latest_saved_models(state, tmp_path / "saved_models")
    state.lr_schedulers = {}
    with pytest.raises(ResumeError, match="saved_modles"):
        hooks.load_latest_saved_models(state, tmp_path / "saved_modles")
    record_keeper.close()
    assert folder_snapshot(tmp_path) == before
    assert hooks.get_accuracy_history(None, "val")["epoch"] == [1, 2, 3]
