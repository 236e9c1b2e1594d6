"""Issue 12's defects, each as the property a user relies on: resuming, saving and reading
training state never loses data, and a bad file or folder gets an error that names it."""

from __future__ import annotations

import os
import sqlite3
import stat
import warnings
from pathlib import Path

import pytest
import torch
from crash_harness import (
    Run,
    accuracy,
    assert_csv_matches_sqlite,
    assert_recovered,
    assert_state_is_epoch,
)
from hook_fakes import PRIMARY_KEY, ScriptedTester, folder_snapshot

from pytorch_metric_learning.errors import CorruptFileError, PMLError, ResumeError
from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.checkpoints import load_checkpoints, save_checkpoints


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """Six epochs saved: best epoch 3, latest 6."""
    run = Run(tmp_path)
    run.train(6)
    run.close()
    return tmp_path


def test_defect1_extra_object_refuses_and_deletes_nothing(trained: Path) -> None:
    before = folder_snapshot(trained)
    run = Run(trained)
    optimizer = run.state.optimizers["trunk_optimizer"]
    run.state.lr_schedulers["extra"] = torch.optim.lr_scheduler.StepLR(optimizer, 3)
    with pytest.raises(ResumeError) as caught:
        run.resume()
    message = str(caught.value)
    assert str(run.model_folder) in message and "'extra'" in message and "[3, 6]" in message
    run.close()
    assert folder_snapshot(trained) == before


def test_files_of_objects_not_in_the_training_state_are_ignored_never_moved(
    trained: Path,
) -> None:
    """Issue 30: only the training state's own object names are its checkpoints; other
    ``.pth`` files (the scheduler's here, pretrained weights named like ``resnet_50.pth``)
    are neither loaded nor moved."""
    (trained / "models" / "resnet_50.pth").write_bytes(b"pretrained")
    before = folder_snapshot(trained)
    run = Run(trained)
    run.state.lr_schedulers = {}
    assert run.resume() == 7
    assert_state_is_epoch(run, 6)
    run.close()
    assert folder_snapshot(trained) == before


def test_defect2_typo_in_the_model_folder_keeps_the_history(trained: Path) -> None:
    before = folder_snapshot(trained)
    run = Run(trained)
    typo = trained / "modles"
    with pytest.raises(ResumeError) as caught:
        run.hooks.load_latest_saved_models(run.state, typo)
    assert str(typo) in str(caught.value) and "[1, 2, 3, 4, 5, 6]" in str(caught.value)
    assert run.hooks.get_accuracy_history(None, "val")["epoch"] == [1, 2, 3, 4, 5, 6]
    run.close()
    assert folder_snapshot(trained) == before


def test_start_fresh_sets_everything_aside_recoverably(trained: Path) -> None:
    files = {p.name: p.read_bytes() for p in (trained / "models").glob("*.pth")}
    with sqlite3.connect(trained / "logs" / "records.db") as conn:
        rows = sorted(conn.execute("SELECT record_group, name, step, value FROM records"))
    run = Run(trained)
    run.state.lr_schedulers = {}  # a different set of objects: allowed when starting fresh
    assert run.hooks.load_latest_saved_models(run.state, run.model_folder, start_fresh=True) == 1
    assert run.hooks.get_accuracy_history(None, "val") == {}
    # Exactly the training state's objects move: the scheduler's files are not its own.
    left = {p.name: p.read_bytes() for p in (trained / "models").glob("*.pth")}
    assert left == {n: b for n, b in files.items() if n.startswith("trunk_scheduler_")} != {}
    moved = {p.name: p.read_bytes() for p in (trained / "models" / "superseded").rglob("*.pth")}
    assert moved == {n: b for n, b in files.items() if n not in left}
    with sqlite3.connect(trained / "logs" / "records.db") as conn:
        sql = "SELECT record_group, name, step, value FROM superseded_records"
        assert sorted(conn.execute(sql)) == rows
    run.close()
    assert_csv_matches_sqlite(trained)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_defect4_damaged_newest_set_falls_back_with_a_warning(trained: Path, damage: str) -> None:
    path = trained / "models" / "trunk_optimizer_6.pth"
    data = path.read_bytes()
    path.write_bytes(
        {"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"x" * 99}[damage]
    )
    run = Run(trained)
    with pytest.warns(RuntimeWarning, match="trunk_optimizer_6.pth"):
        start = run.resume()
    # Epoch 6's set is unusable; the best set (epoch 3) is the newest complete one.
    assert start == 4
    assert_state_is_epoch(run, 3)
    assert run.hooks.get_accuracy_history(None, "val")["epoch"] == [1, 2, 3]
    run.close()
    # Nothing was dropped: epoch 6's files and epochs 4-6's records were set aside.
    assert (trained / "models" / "superseded").is_dir()
    with sqlite3.connect(trained / "logs" / "records.db") as conn:
        sql = "SELECT DISTINCT step FROM superseded_records WHERE record_group = 'accuracies_val'"
        assert sorted(s for (s,) in conn.execute(sql)) == [4, 5, 6]
    assert_recovered(trained)


def test_defect4_no_object_changes_before_the_whole_set_is_read(trained: Path) -> None:
    for path in (trained / "models").glob("trunk_optimizer_*.pth"):
        path.write_bytes(b"")
    before = folder_snapshot(trained)
    run = Run(trained)
    weight = run.state.models["trunk"].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ResumeError, match="models"):
            run.resume()
    assert torch.equal(run.state.models["trunk"].weight, weight)
    run.close()
    assert folder_snapshot(trained) == before


def test_a_set_that_does_not_fit_loads_nothing(tmp_path: Path) -> None:
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(3, 3)
    save_checkpoints({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 2)}, tmp_path, 1)
    weight = first.weight.detach().clone()
    with pytest.raises(CorruptFileError, match="'b'"):
        load_checkpoints({"a": first, "b": second}, tmp_path, 1)
    assert torch.equal(first.weight, weight)


@pytest.mark.parametrize("content", [b"", b"garbage" * 10])
def test_defect8_unreadable_checkpoint_error_names_the_file(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "trunk_1.pth").write_bytes(content)
    with pytest.raises(CorruptFileError, match="trunk_1.pth"):
        load_checkpoints({"trunk": torch.nn.Linear(2, 2)}, tmp_path, 1)


def test_defect7_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run = Run(tmp_path)
        run.train(1)
        run.close()
    finally:
        os.umask(old)
    for path in [*tmp_path.rglob("*.pth"), *tmp_path.rglob("*.csv")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_defect7_leftover_temp_files_are_removed_by_the_next_save(trained: Path) -> None:
    leftovers = [
        trained / "models" / ".trunk_6.pth.0a1b2c3d.tmp",
        trained / "models" / ".trunk_best7.pth.abcd0123.tmp",
        trained
        / "logs"
        / "accuracies_val"
        / ".mean_average_precision_at_r_level0.csv.1234abcd.tmp",
    ]
    mine = trained / "models" / ".notes.txt.12345678.tmp"  # not a name the library writes
    for path in [*leftovers, mine]:
        path.write_bytes(b"partial")
    run = Run(trained)
    run.train(8)
    run.close()
    assert [p for p in leftovers if p.exists()] == [] and mine.exists()


def test_defect7_records_best_is_the_loadable_best_after_a_crash(
    tmp_path: Path, monkeypatch
) -> None:
    run = Run(tmp_path)
    run.train(6)

    # Epoch 7 is a new best; the process dies after its checkpoints, before its records.
    save_records = run.keeper.save_records

    def die() -> None:
        if any(r.group == "accuracies_val" for r in run.keeper._pending):
            raise KeyboardInterrupt
        save_records()

    monkeypatch.setattr(run.keeper, "save_records", die)
    with pytest.raises(KeyboardInterrupt):
        run.epoch(7)
    assert (tmp_path / "models" / "trunk_best7.pth").exists()
    monkeypatch.undo()
    reader = Run(tmp_path)
    best_epoch, _ = reader.hooks.get_best_epoch_and_accuracy(None, "val")
    assert best_epoch == 3
    assert reader.hooks.load_best_saved_models(reader.state, reader.model_folder) == 3
    assert_state_is_epoch(reader, 3)
    reader.close()
    assert assert_recovered(tmp_path) == (6, 3)


def test_errors_are_the_librarys_own() -> None:
    assert issubclass(ResumeError, PMLError) and issubclass(CorruptFileError, ValueError)


def test_an_optimizer_that_does_not_fit_loads_nothing(tmp_path: Path) -> None:
    trunk = torch.nn.Linear(2, 2)
    saved = {"trunk": trunk, "opt": torch.optim.SGD([trunk.weight], lr=0.1)}
    save_checkpoints(saved, tmp_path, 1)
    target = torch.nn.Linear(2, 2)
    weight = target.weight.detach().clone()
    optimizer = torch.optim.SGD(target.parameters(), lr=0.5)  # two parameters, not one
    with pytest.raises(CorruptFileError, match="'opt'"):
        load_checkpoints({"trunk": target, "opt": optimizer}, tmp_path, 1)
    assert torch.equal(target.weight, weight) and optimizer.param_groups[0]["lr"] == 0.5


def test_a_scheduler_that_refuses_its_state_puts_everything_back(tmp_path: Path) -> None:
    class Picky:
        def state_dict(self) -> dict:
            return {"ok": False}

        def load_state_dict(self, state: dict) -> None:
            if not state["ok"]:
                raise ValueError("refused")

    source = torch.nn.Linear(2, 2)
    save_checkpoints({"trunk": source, "z": Picky()}, tmp_path, 1)
    target = torch.nn.Linear(2, 2)
    weight = target.weight.detach().clone()
    with pytest.raises(CorruptFileError, match="'z'"):
        load_checkpoints({"trunk": target, "z": Picky()}, tmp_path, 1)
    # The model was loaded first, then put back when the scheduler refused.
    assert torch.equal(target.weight, weight)


def test_changed_primary_metric_keeps_the_best_saved_under_the_old_one(trained: Path) -> None:
    # The first run chose its best (epoch 3) by MAP@R; the resumed run ranks by a metric the
    # old records lack, so nothing says the old best is worse: its checkpoint must stay.
    old_best = sorted(p.name for p in (trained / "models").glob("*_best3.pth"))
    assert old_best
    run = Run(trained)
    run.hooks = logging_presets.get_hook_container(
        run.keeper, log_freq=1, primary_metric="mean_reciprocal_rank"
    )
    run.tester = ScriptedTester(
        lambda e: {PRIMARY_KEY: accuracy(e), "mean_reciprocal_rank_level0": 0.5}
    )
    run.end_of_epoch = run.hooks.end_of_epoch_hook(run.tester, {"val": None}, run.model_folder)
    assert run.resume() == 7
    run.epoch(7)
    run.epoch(8)
    run.close()
    kept = sorted(p.name for p in (trained / "models").glob("*_best3.pth"))
    assert kept == old_best
    assert list((trained / "models").glob("*_best7.pth"))  # the new metric's best
