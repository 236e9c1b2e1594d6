"""Issue 30, parts 2 and 3: one run owns its folders, and touches only its own files.

The lock tests use two real processes: a child forked from the test trains in a folder
and stops at a known point (it says so through a pipe and waits for the test's word), so
every check happens at a chosen moment, never after a sleep.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from crash_harness import (
    Run,
    assert_csv_matches_sqlite,
    assert_recovered,
    assert_state_is_epoch,
    expected_best,
    needs_fork,
)
from hook_fakes import PRIMARY_KEY, folder_snapshot

from pytorch_metric_learning.errors import FileWriteError, FolderInUseError, ResumeError
from pytorch_metric_learning.utils import logging_presets


@contextmanager
def child_training(root: Path, pause_after: int, last_epoch: int) -> Iterator[int]:
    """A process that trains ``root`` to ``pause_after``, says so, waits for the word,
    trains on to ``last_epoch`` and exits 0. Yields its PID while it waits."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            run = Run(root)
            run.train(pause_after)
            os.write(ready_w, b"r")
            if os.read(go_r, 1) == b"g":
                for epoch in range(pause_after + 1, last_epoch + 1):
                    run.epoch(epoch)
                run.close()
                code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"r", "the training child died before its pause"
        yield pid
        os.write(go_w, b"g")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        os.close(ready_r)
        os.close(go_w)
        with pytest.raises(ChildProcessError):  # reaped
            os.waitpid(pid, os.WNOHANG)


@needs_fork
def test_a_second_process_is_refused_naming_the_folder_and_the_holder(tmp_path: Path) -> None:
    with child_training(tmp_path, pause_after=3, last_epoch=5) as holder:
        before = folder_snapshot(tmp_path)
        second = Run(tmp_path)
        with pytest.raises(FolderInUseError) as caught:
            second.resume()  # a resume while the first run trains
        message = str(caught.value)
        assert f"PID {holder}" in message and str(tmp_path / "logs") in message
        assert isinstance(caught.value, ResumeError) and isinstance(caught.value, FileWriteError)
        second.keeper.update_records({"loss": 1.0}, 99, "loss_histories")
        with pytest.raises(FolderInUseError, match=f"PID {holder}"):
            second.keeper.save_records()
        assert second.keeper._pending  # the queue is kept
        second.keeper._pending.clear()
        second.close()
        assert folder_snapshot(tmp_path) == before  # nothing moved, nothing written
    # The first run went on undisturbed: its records name epoch 5 and its best set loads.
    assert assert_recovered(tmp_path) == (5, expected_best(5))


@needs_fork
def test_the_model_folder_alone_is_locked_too(tmp_path: Path) -> None:
    with child_training(tmp_path, pause_after=1, last_epoch=1) as holder:
        other = Run(tmp_path / "other_logs")
        other.model_folder = tmp_path / "models"  # the first run's model folder
        with pytest.raises(FolderInUseError, match=f"model folder .*PID {holder}"):
            other.hooks.load_latest_saved_models(other.state, other.model_folder)
        other.close()


@needs_fork
def test_a_stale_lock_of_a_killed_process_never_blocks(tmp_path: Path) -> None:
    ready_r, ready_w = os.pipe()
    never_r, never_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            run = Run(tmp_path)
            run.train(2)
            os.write(ready_w, b"r")
            os.read(never_r, 1)  # nobody writes: it waits here until killed
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"r"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    for fd in (ready_r, never_r, never_w):
        os.close(fd)
    run = Run(tmp_path)
    assert run.resume() == 3
    run.epoch(3)
    run.close()
    assert assert_recovered(tmp_path) == (3, expected_best(3))


def test_one_process_may_open_its_own_folders_twice(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.train(2)
    second = Run(tmp_path)  # same process: shares the lock (as hooks of two splits do)
    assert second.resume() == 3
    second.close()
    first.close()


# ---------------------------------------------------------------- this run's files only
def test_pretrained_weights_named_like_checkpoints_are_never_moved(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    pretrained = {"resnet_50.pth": b"resnet weights", "vit_base_16.pth": b"vit weights"}
    # the run's own object names, but the epoch is not a canonical decimal: a user's files
    for name in ("trunk_01.pth", "trunk_best01.pth", "trunk_+1.pth", "trunk_\u0663.pth"):
        pretrained[name] = name.encode()
    for name, data in pretrained.items():
        (models / name).write_bytes(data)
    run = Run(tmp_path)
    run.train(3)
    run.close()
    run = Run(tmp_path)  # resume works: the files are not this run's objects
    assert run.resume() == 4
    assert_state_is_epoch(run, 3)
    assert run.hooks.load_latest_saved_models(run.state, run.model_folder, start_fresh=True) == 1
    run.close()
    assert {name: (models / name).read_bytes() for name in pretrained} == pretrained
    assert not list((models / "superseded").rglob("resnet_50.pth"))
    assert sorted(p.name for p in models.glob("*.pth")) == sorted(pretrained)


@pytest.mark.parametrize(
    ("mine", "theirs"), [(None, "expB"), ("a", "a_b"), ("a_b", "a"), ("expB", None)]
)
def test_start_fresh_moves_exactly_this_containers_groups(
    tmp_path: Path, mine: str | None, theirs: str | None
) -> None:
    keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = {
        prefix: logging_presets.get_hook_container(keeper, record_group_name_prefix=prefix)
        for prefix in (mine, theirs)
    }
    for container in hooks.values():
        group = container.accuracy_group_name("val")
        keeper.update_records({PRIMARY_KEY: 0.5}, 1, group, step_name="epoch")
        loss_group = container.record_group_name("loss_histories")
        keeper.update_records({"loss": 1.0}, 0, loss_group, step_name="iteration")
    keeper.save_records()
    state = logging_presets.TrainingState(models={"trunk": torch.nn.Linear(2, 2)})
    hooks[mine].load_latest_saved_models(state, tmp_path / "models", start_fresh=True)
    with sqlite3.connect(tmp_path / "logs" / "records.db") as conn:
        left = {g for (g,) in conn.execute("SELECT DISTINCT record_group FROM records")}
        moved = {g for (g,) in conn.execute("SELECT record_group FROM superseded_records")}
    theirs_groups = {f"{theirs}_{g}" if theirs else g for g in ("accuracies_val", "loss_histories")}
    mine_groups = {f"{mine}_{g}" if mine else g for g in ("accuracies_val", "loss_histories")}
    assert left == theirs_groups and moved == mine_groups
    keeper.close()
    assert_csv_matches_sqlite(tmp_path)


def test_load_best_refuses_when_the_recorded_best_has_no_complete_set(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.train(5)  # best epoch 3
    run.close()
    (tmp_path / "models" / "trunk_optimizer_best3.pth").unlink()
    (tmp_path / "models" / "trunk_best1.pth").write_bytes(b"")  # bait: an older best
    reader = Run(tmp_path)
    fresh = Run(tmp_path / "elsewhere")
    with pytest.raises(ResumeError, match="epoch 3"):
        reader.hooks.load_best_saved_models(fresh.state, reader.model_folder)
    assert not torch.equal(fresh.state.models["trunk"].weight, torch.full((2, 3), 1.0))
    fresh.close()
    reader.close()


def test_tensorboard_events_of_set_aside_epochs_are_moved_aside(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run_with_tensorboard(last_epoch: int) -> None:
        run = Run(tmp_path, tensorboard=True)
        run.train(last_epoch)
        run.close()

    run_with_tensorboard(4)
    (tmp_path / "models" / "trunk_4.pth").unlink()  # epoch 4's set is gone: rewind to 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_with_tensorboard(5)
    events = [p for p in (tmp_path / "tb").glob("events.out.tfevents.*")]
    assert len(events) == 1  # the old run's file moved aside
    assert list((tmp_path / "tb" / "superseded").rglob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    steps = [e.step for e in accumulator.Scalars(f"accuracies_val/{PRIMARY_KEY}")]
    assert sorted(steps) == [1, 2, 3, 4, 5]  # one value per epoch, the kept ones


def test_start_fresh_in_the_same_process_leaves_one_value_per_step(tmp_path: Path) -> None:
    """The documented "Starting fresh" flow in one process: train 2 epochs with
    TensorBoard, ``start_fresh=True``, train 2 more. The live event file is closed and
    moved aside: TensorBoard shows each step once."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = Run(tmp_path, tensorboard=True)
    run.train(2)
    start = run.hooks.load_latest_saved_models(run.state, run.model_folder, start_fresh=True)
    for epoch in range(start, start + 2):
        run.epoch(epoch)
    run.close()
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    steps = [e.step for e in accumulator.Scalars(f"accuracies_val/{PRIMARY_KEY}")]
    assert sorted(steps) == list(range(start, start + 2))  # each step once
