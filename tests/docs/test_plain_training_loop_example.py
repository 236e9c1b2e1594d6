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
