"""A tiny training run whose state is known at every epoch, and the checks that a crash of
it lost nothing. Shared by the fault-injection and kill -9 suites.

The trunk's weights are filled with the epoch number before each epoch's save, and the
validation accuracy of an epoch is a fixed function of it, so every file and record can be
checked against a plain, independent expectation.
"""

from __future__ import annotations

import csv
import math
import os
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from hook_fakes import PRIMARY_KEY, ScriptedTester

from pytorch_metric_learning.utils import logging_presets

ITERATIONS_PER_EPOCH = 2

# The suites that fork a training child: it kills itself (SIGKILL) or holds a lock (flock).
needs_fork = pytest.mark.skipif(
    sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork, SIGKILL and flock"
)


def accuracy(epoch: int) -> float:
    """Rises and falls: new bests at epochs 1, 3, 7 and 9, a tie at 5, then now and then."""
    if epoch <= 12:
        return [0.3, 0.2, 0.6, 0.5, 0.6, 0.4, 0.9, 0.8, 0.95, 0.1, 0.3, 0.8][epoch - 1]
    return 0.9 + ((epoch * 37) % 17) / 170 + epoch / 1e5


def expected_best(last_epoch: int) -> int:
    """The first epoch whose accuracy is strictly greater than every earlier one's."""
    best = 1
    for epoch in range(2, last_epoch + 1):
        if accuracy(epoch) > accuracy(best):
            best = epoch
    return best


class Run:
    """One training process: record keeper, hooks, state and epoch hook on ``root``."""

    def __init__(self, root: Path, patience: int | None = None, tensorboard: bool = False) -> None:
        self.root = root
        self.model_folder = root / "models"
        tensorboard_folder = root / "tb" if tensorboard else None
        self.keeper, _, _ = logging_presets.get_record_keeper(root / "logs", tensorboard_folder)
        self.hooks = logging_presets.get_hook_container(self.keeper, log_freq=1)
        trunk = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(trunk.parameters(), lr=0.1, momentum=0.9)
        self.state = logging_presets.TrainingState(
            models={"trunk": trunk},
            optimizers={"trunk_optimizer": optimizer},
            lr_schedulers={"trunk_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2)},
        )
        self.tester = ScriptedTester(lambda e: {PRIMARY_KEY: accuracy(e)})
        self.end_of_epoch = self.hooks.end_of_epoch_hook(
            self.tester, {"val": None}, self.model_folder, patience=patience
        )

    def resume(self) -> int:
        return self.hooks.load_latest_saved_models(self.state, self.model_folder)

    def epoch(self, epoch: int) -> bool:
        """Run one epoch: two iterations (recorded losses), then the epoch hook."""
        self.state.epoch = epoch
        trunk = self.state.models["trunk"]
        for i in range(ITERATIONS_PER_EPOCH):
            self.state.global_iteration = (epoch - 1) * ITERATIONS_PER_EPOCH + i
            self.state.losses = {"loss": 100.0 * epoch + i}
            self.hooks.end_of_iteration_hook(self.state)
        with torch.no_grad():
            trunk.weight.fill_(float(epoch))
        self.state.optimizers["trunk_optimizer"].step()
        self.state.lr_schedulers["trunk_scheduler"].step()
        return self.end_of_epoch(self.state)

    def train(self, last_epoch: int) -> int:
        start = self.resume()
        for epoch in range(start, last_epoch + 1):
            self.epoch(epoch)
        return start

    def close(self) -> None:
        self.keeper.close()


def sqlite_rows(root: Path, group: str) -> list[tuple[str, int, float]]:
    """(name, step, value) of a group, read with plain sqlite3."""
    with sqlite3.connect(root / "logs" / "records.db") as conn:
        sql = "SELECT name, step, value FROM records WHERE record_group = ? ORDER BY name, step"
        return conn.execute(sql, (group,)).fetchall()


def csv_rows(path: Path) -> list[tuple[int, float]]:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))[1:]
    return [(int(step), float(value)) for step, value in rows]


def assert_csv_matches_sqlite(root: Path) -> None:
    """Every (group, name) of SQLite has a CSV file with exactly its rows, and every CSV
    row is in SQLite (a file whose rows were all set aside keeps only its header)."""
    with sqlite3.connect(root / "logs" / "records.db") as conn:
        rows = conn.execute("SELECT record_group, name, step, value FROM records").fetchall()
    expected: dict[Path, list[tuple[int, float]]] = {}
    for group, name, step, value in rows:
        path = root / "logs" / group / f"{name}.csv"
        expected.setdefault(path, []).append((step, math.nan if value is None else value))
    found = {p: csv_rows(p) for p in (root / "logs").rglob("*.csv")}
    found = {p: rows for p, rows in found.items() if rows}
    assert found == {p: sorted(v) for p, v in expected.items()}


def assert_no_temp_files(root: Path) -> None:
    assert [p for p in root.rglob("*.tmp")] == []


def assert_state_is_epoch(run: Run, epoch: int) -> None:
    assert torch.equal(run.state.models["trunk"].weight, torch.full((2, 3), float(epoch)))


def assert_best_loads(root: Path) -> None:
    """The best epoch the records name is the best checkpoint that loads, with its weights.
    (Before the first commit the records name none; a complete best set of that first,
    uncommitted epoch may then load, as a save without records would.)"""
    reader = Run(root)
    best_epoch, _ = reader.hooks.get_best_epoch_and_accuracy(None, "val")
    fresh = Run(root / "elsewhere")
    loaded = reader.hooks.load_best_saved_models(fresh.state, reader.model_folder)
    if best_epoch is not None:
        assert loaded == best_epoch
        assert_state_is_epoch(fresh, best_epoch)
    else:
        assert loaded in (None, 1)
    fresh.close()
    reader.close()


def assert_recovered(root: Path) -> tuple[int, int | None]:
    """After any crash: a new process resumes where the records end, the records hold each
    epoch once with its true value, CSV equals SQLite, and the best epoch the records name
    is the best checkpoint that loads. Returns (last committed epoch, best epoch)."""
    assert_best_loads(root)  # even before anything resumes
    run = Run(root)
    start = run.resume()
    last = start - 1
    accuracies = [r for r in sqlite_rows(root, "accuracies_val") if r[0] == PRIMARY_KEY]
    assert accuracies == [(PRIMARY_KEY, e, accuracy(e)) for e in range(1, last + 1)]
    losses = sqlite_rows(root, "loss_histories")
    steps = [step for _, step, _ in losses]
    assert len(steps) == len(set(steps))
    assert all(value == 100.0 * (step // 2 + 1) + step % 2 for _, step, value in losses)
    assert_csv_matches_sqlite(root)
    if last:
        assert_state_is_epoch(run, last)
    best_epoch, _ = run.hooks.get_best_epoch_and_accuracy(None, "val")
    assert best_epoch == (expected_best(last) if last else None)
    if best_epoch is not None:
        fresh = Run(root / "elsewhere")
        assert run.hooks.load_best_saved_models(fresh.state, run.model_folder) == best_epoch
        assert_state_is_epoch(fresh, best_epoch)
        fresh.close()
    run.close()
    return last, best_epoch


# ---------------------------------------------------------------- seeded kill points
def die_at_write(kill_at: int, counter: list[int] | None = None) -> None:
    """Make this process SIGKILL itself at its ``kill_at``-th write event (1-based).

    The write events of a save, in order: each checkpoint file's start, its temporary
    file complete but not yet renamed, its rename done; each records commit (one that
    writes) before and after. Counting them makes every kill point reproducible (no timing involved): the
    same folder and the same ``kill_at`` kill the same write. ``counter``, when given,
    only counts (``kill_at`` is then ignored) into ``counter[0]``.
    """
    import signal

    from pytorch_metric_learning import _atomic
    from pytorch_metric_learning.utils import checkpoints, record_keeping

    seen = counter if counter is not None else [0]

    def event() -> None:
        seen[0] += 1
        if counter is None and seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    write_state = checkpoints._write_state
    replace = _atomic.os.replace
    commit = record_keeping.SQLiteManager._commit

    def counted_write_state(state: object, path: Path) -> None:
        event()
        write_state(state, path)
        event()

    def counted_replace(source: object, target: object) -> None:
        if str(target).endswith(".pth"):
            event()
        replace(source, target)

    def counted_commit(conn: sqlite3.Connection) -> None:
        if not conn.in_transaction:  # a read: nothing to commit
            commit(conn)
            return
        event()
        commit(conn)
        event()

    checkpoints._write_state = counted_write_state  # type: ignore[assignment]
    _atomic.os.replace = counted_replace  # type: ignore[assignment]
    record_keeping.SQLiteManager._commit = staticmethod(counted_commit)  # type: ignore[assignment]
