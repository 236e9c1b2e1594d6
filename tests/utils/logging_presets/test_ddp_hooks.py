"""Under torch.distributed only rank 0 records and saves; every rank tracks the best epoch.

The rank is faked by patching ``torch.distributed`` (the real one, spawned, is exercised
by tests/testers/test_ddp_tester.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from hook_fakes import PRIMARY_KEY, ScriptedTester, make_trainer

from pytorch_metric_learning.utils import logging_presets

ACCS = {1: 0.2, 2: 0.5, 3: 0.4, 4: 0.5, 5: 0.6, 6: 0.1, 7: 0.3, 8: 0.2, 9: 0.2, 10: 0.9}
DATASETS = {"val": object(), "train": object()}


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)  # the DataLoader asks


def run(folder: Path, num_epochs: int = 10, patience: int | None = 2):
    record_keeper, db, writer = logging_presets.get_record_keeper(folder / "logs", folder / "tb")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
    end_of_epoch = hooks.end_of_epoch_hook(tester, DATASETS, folder / "models", patience=patience)
    trainer = make_trainer(
        end_of_iteration_hook=hooks.end_of_iteration_hook, end_of_epoch_hook=end_of_epoch
    )
    trainer.train(num_epochs=num_epochs)
    return hooks, tester, trainer, writer


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_other_ranks_write_nothing_but_stop_with_rank_0(tmp_path, monkeypatch) -> None:
    pytest.importorskip("tensorboard")
    hooks0, tester0, trainer0, writer0 = run(tmp_path / "rank0")
    assert writer0 is not None
    as_rank(monkeypatch, 1)
    hooks1, tester1, trainer1, writer1 = run(tmp_path / "rank1")
    assert writer1 is None and not (tmp_path / "rank1" / "tb").exists()
    assert not (tmp_path / "rank1" / "models").exists() or not files_under(
        tmp_path / "rank1" / "models"
    )
    assert [p for p in files_under(tmp_path / "rank1" / "logs") if p.endswith(".csv")] == []
    assert hooks1.record_keeper.groups() == []
    assert trainer1.epoch == trainer0.epoch < 10  # patience ran out at the same epoch
    assert tester1.calls == tester0.calls
    best = hooks0.get_best_epoch_and_accuracy(tester0, "val")
    assert hooks1.get_best_epoch_and_accuracy(tester1, "val") == best == (5, ACCS[5])


def test_save_models_writes_on_rank_0_only(tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    as_rank(monkeypatch, 2)
    hooks.save_models(trainer, tmp_path / "models", 1, is_new_best=True)
    assert not (tmp_path / "models").exists()
    as_rank(monkeypatch, 0)
    hooks.save_models(trainer, tmp_path / "models", 1, is_new_best=True)
    assert "trunk_best1.pth" in files_under(tmp_path / "models")


def test_a_restart_on_another_rank_deletes_nothing(tmp_path, monkeypatch) -> None:
    """Rank 0 crashed after recording epoch 6 but before saving it. On a restart, rank 1
    leaves the folders alone, and reads the best epoch only when it needs it (at its first
    test, after rank 0 has discarded epoch 6)."""
    run(tmp_path, num_epochs=5, patience=None)
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    record_keeper.update_records({PRIMARY_KEY: 0.99}, 6, "accuracies_val", step_name="epoch")
    record_keeper.save_records()
    (tmp_path / "models" / "trunk_6.pth").write_bytes(b"incomplete")
    before = files_under(tmp_path)
    as_rank(monkeypatch, 1)
    keeper1, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks1 = logging_presets.get_hook_container(keeper1)
    assert hooks1.load_latest_saved_models(make_trainer(), tmp_path / "models") == 6
    assert files_under(tmp_path) == before
    assert keeper1.history("accuracies_val", [PRIMARY_KEY])[0] == [1, 2, 3, 4, 5, 6]
    as_rank(monkeypatch, 0)
    keeper0, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks0 = logging_presets.get_hook_container(keeper0)
    assert hooks0.load_latest_saved_models(make_trainer(), tmp_path / "models") == 6
    assert "trunk_6.pth" not in files_under(tmp_path / "models")
    as_rank(monkeypatch, 1)
    assert hooks1.get_best_epoch_and_accuracy(None, "val") == (5, ACCS[5])


def test_iteration_records_on_rank_0_only(tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    trainer.losses = {"total_loss": 0.5}
    trainer.get_global_iteration = lambda: 0
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, log_freq=1)
    as_rank(monkeypatch, 1)
    hooks.end_of_iteration_hook(trainer)
    assert hooks.get_loss_history() == {}
    as_rank(monkeypatch, 0)
    hooks.end_of_iteration_hook(trainer)
    assert hooks.get_loss_history() == {"iteration": [0], "~iteration~": [0], "total_loss": [0.5]}
