"""Crashes while saving, and restarts: the best model stays loadable, the best epoch survives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hook_fakes import ScriptedTester, folder_snapshot, make_trainer

from pytorch_metric_learning.errors import ResumeError
from pytorch_metric_learning.utils import logging_presets

# Rises to a best at epoch 4, then never beats it.
ACCS = {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.6, 5: 0.5, 6: 0.55, 7: 0.4, 8: 0.6, 9: 0.1, 10: 0.2}
DATASETS = {"val": None}


class Session:
    """One training process: its own record keeper, hooks, tester and trainer."""

    def __init__(self, tmp_path: Path, patience: int | None = None, **trainer_kwargs: Any) -> None:
        self.model_folder = tmp_path / "models"
        record_keeper, self.db, _ = logging_presets.get_record_keeper(tmp_path / "logs")
        self.hooks = logging_presets.get_hook_container(record_keeper)
        self.tester = ScriptedTester(ACCS, end_of_testing_hook=self.hooks.end_of_testing_hook)
        hook = self.hooks.end_of_epoch_hook(
            self.tester, DATASETS, self.model_folder, patience=patience
        )
        self.trainer = make_trainer(
            end_of_iteration_hook=self.hooks.end_of_iteration_hook,
            end_of_epoch_hook=hook,
            **trainer_kwargs,
        )

    def best(self) -> tuple[int | None, float]:
        return self.hooks.get_best_epoch_and_accuracy(self.tester, "val")

    def files(self) -> list[str]:
        return sorted(p.name for p in self.model_folder.iterdir() if p.is_file())

    def set_aside(self) -> list[str]:
        """Checkpoint files moved to ``superseded/`` by a resume."""
        return sorted(p.name for p in (self.model_folder / "superseded").glob("*/*.pth"))


def fail_on_call(target: Any, name: str, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    """Make ``target.name`` raise on its ``fail_at``-th call (counting from 1)."""
    original, calls = getattr(target, name), []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == fail_at:
            raise OSError("simulated crash")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)


NAMES = ["trunk", "embedder", "trunk_optimizer", "embedder_optimizer"]


def saved_weight(folder: Path, suffix: str) -> torch.Tensor:
    return torch.load(folder / f"trunk_{suffix}.pth", weights_only=True)["weight"]


# Epoch 4 is a new best: it writes 4 best files, then 4 latest files. Fail at each step.
@pytest.mark.parametrize("target, name", [(torch, "save"), (os, "replace")])
@pytest.mark.parametrize("fail_at", [1, 3, 5, 8])
def test_crash_while_saving_keeps_previous_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any, name: str, fail_at: int
) -> None:
    first = Session(tmp_path)
    first.trainer.train(num_epochs=3)
    assert first.best() == (3, 0.3)
    weights_at_3 = first.tester.snapshots[3]["weight"]
    fail_on_call(target, name, monkeypatch, fail_at)
    with pytest.raises(OSError, match="simulated crash"):
        first.trainer.train(start_epoch=4, num_epochs=10)
    monkeypatch.undo()

    assert not [f for f in first.files() if f.endswith(".tmp")]
    assert torch.equal(saved_weight(first.model_folder, "best3"), weights_at_3)
    fresh = make_trainer()
    assert first.hooks.load_best_saved_models(fresh, first.model_folder) in (3, 4)

    second = Session(tmp_path, patience=2)
    start = second.hooks.load_latest_saved_models(second.trainer, second.model_folder)
    assert start == 4
    assert second.best() == (3, 0.3)
    assert torch.equal(second.trainer.models["trunk"].weight, weights_at_3)
    assert second.files() == sorted(
        [f"{n}_3.pth" for n in NAMES] + [f"{n}_best3.pth" for n in NAMES]
    )
    assert second.hooks.get_accuracy_history(second.tester, "val")["epoch"] == [1, 2, 3]


def test_restart_keeps_best_epoch_and_patience(tmp_path: Path) -> None:
    first = Session(tmp_path, patience=3)
    first.trainer.train(num_epochs=6)
    assert first.best() == (4, 0.6)

    second = Session(tmp_path, patience=3)
    start = second.hooks.load_latest_saved_models(second.trainer, second.model_folder)
    assert start == 7
    assert second.best() == (4, 0.6)
    for name, value in first.trainer.models["trunk"].state_dict().items():
        assert torch.equal(second.trainer.models["trunk"].state_dict()[name], value)
    second.trainer.train(start_epoch=start, num_epochs=10)
    # Epoch 8 ties the best (not a new best), so training stops at 8 - 4 > 3.
    assert second.trainer.epoch == 8
    assert second.tester.calls == [7, 8]
    assert second.hooks.get_accuracy_history(second.tester, "val")["epoch"] == list(range(1, 9))
    assert (second.model_folder / "trunk_best4.pth").exists()
    assert second.files() == sorted(
        [f"{n}_8.pth" for n in NAMES] + [f"{n}_best4.pth" for n in NAMES]
    )


def test_epoch_whose_save_failed_is_not_committed(tmp_path: Path, monkeypatch) -> None:
    first = Session(tmp_path)
    first.trainer.train(num_epochs=3)
    fail_on_call(torch, "save", monkeypatch, 1)  # epoch 4 is tested, its save fails
    with pytest.raises(OSError):
        first.trainer.train(start_epoch=4, num_epochs=4)
    monkeypatch.undo()
    # The records are committed after the checkpoints: epoch 4 is not in them.
    assert first.hooks.get_accuracy_history(first.tester, "val")["epoch"] == [1, 2, 3]
    assert first.best() == (3, 0.3)

    second = Session(tmp_path)
    assert second.hooks.load_latest_saved_models(second.trainer, second.model_folder) == 4
    assert second.hooks.get_accuracy_history(second.tester, "val")["epoch"] == [1, 2, 3]
    csv_path = tmp_path / "logs" / "accuracies_val" / "mean_average_precision_at_r_level0.csv"
    assert csv_path.read_text().splitlines()[1:] == ["1,0.1", "2,0.2", "3,0.3"]
    second.trainer.train(start_epoch=4, num_epochs=5)
    assert second.best() == (4, 0.6)
    assert second.hooks.get_accuracy_history(second.tester, "val")["epoch"] == [1, 2, 3, 4, 5]
    assert csv_path.read_text().splitlines()[1:] == ["1,0.1", "2,0.2", "3,0.3", "4,0.6", "5,0.5"]


def test_nothing_saved_resumes_at_epoch_one(tmp_path: Path) -> None:
    session = Session(tmp_path)
    assert session.hooks.load_latest_saved_models(session.trainer, tmp_path / "empty") == 1
    assert session.hooks.load_best_saved_models(session.trainer, tmp_path / "empty") is None


def test_incomplete_latest_set_falls_back_to_the_best_set(tmp_path: Path) -> None:
    first = Session(tmp_path)
    first.trainer.train(num_epochs=2)
    weights_at_2 = first.tester.snapshots[2]["weight"]
    (first.model_folder / "embedder_2.pth").unlink()
    second = Session(tmp_path)
    # trunk_best2.pth ... is the same state as epoch 2's latest set.
    assert second.hooks.load_latest_saved_models(second.trainer, second.model_folder) == 3
    assert torch.equal(second.trainer.models["trunk"].weight, weights_at_2)


def test_no_complete_set_but_records_refuses_and_changes_nothing(tmp_path: Path) -> None:
    first = Session(tmp_path)
    first.trainer.train(num_epochs=2)
    (first.model_folder / "embedder_2.pth").unlink()
    (first.model_folder / "embedder_best2.pth").unlink()
    before = folder_snapshot(tmp_path)
    second = Session(tmp_path)
    with pytest.raises(ResumeError, match="epochs \\[2\\]"):
        second.hooks.load_latest_saved_models(second.trainer, second.model_folder)
    assert folder_snapshot(tmp_path) == before
