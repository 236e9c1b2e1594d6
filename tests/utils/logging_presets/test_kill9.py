"""kill -9 a training process at chosen writes; every restart loses nothing.

A child process (forked from the test, so it starts in milliseconds instead of importing
torch again) trains in a folder and SIGKILLs itself at its N-th write event (see
``crash_harness.die_at_write``: each checkpoint file's start, its temporary file complete,
its rename; each records commit, before and after). The kill points are chosen from the
writes, never from timing, so every run of the test kills the same writes. After each
kill a fresh record keeper and hooks check what a user relies on: the best model the
records name loads, resume continues with the same best epoch, every record is there
once with its true value, CSV agrees with SQLite, and a committed epoch is never lost.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import pytest
from crash_harness import (
    Run,
    assert_no_temp_files,
    assert_recovered,
    die_at_write,
    expected_best,
    needs_fork,
)

pytestmark = needs_fork

KILLED_EPOCHS = 2  # every write event of epochs 1 (a new best) and 2 is a kill point


def train_in_child(root: Path, last_epoch: int, kill_at: int = 0, count_to: Path | None = None):
    """Fork a process that resumes and trains up to ``last_epoch``, killing itself at its
    ``kill_at``-th write (0: never); ``count_to`` gets the number of write events.
    Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            counter = [0] if count_to is not None else None
            if kill_at or counter is not None:
                die_at_write(kill_at, counter)
            run = Run(root)
            run.train(last_epoch)
            run.close()
            if count_to is not None and counter is not None:
                count_to.write_text(str(counter[0]))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def finished(status: int) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def write_events(root: Path, last_epoch: int) -> int:
    """How many write events training from scratch to ``last_epoch`` makes."""
    count = root / "count.txt"
    assert finished(train_in_child(root / "counted", last_epoch, count_to=count))
    return int(count.read_text())


@pytest.mark.slow
def test_kill_9_at_every_write_of_the_first_epochs_then_resume(folder: Path) -> None:
    """A fresh run killed at write k, for every k of the first epochs' saves (the
    first save of all, interrupted between two files of its set, included)."""
    total = write_events(folder, KILLED_EPOCHS)
    assert total > 20 * KILLED_EPOCHS  # the counter sees the saves
    for kill_at in range(1, total + 1):
        root = folder / f"kill{kill_at}"
        assert killed(train_in_child(root, KILLED_EPOCHS, kill_at)), kill_at
        last, best = assert_recovered(root)
        assert best == (expected_best(last) if last else None)
        assert finished(train_in_child(root, KILLED_EPOCHS + 1)), kill_at
        assert_no_temp_files(root)
        assert assert_recovered(root) == (KILLED_EPOCHS + 1, expected_best(KILLED_EPOCHS + 1))


@pytest.mark.slow
def test_repeated_kills_at_seeded_writes_never_lose_a_committed_epoch(folder: Path) -> None:
    """One folder, killed again and again at seeded write counts of each new process."""
    rng = random.Random(12)
    committed = 0
    for _ in range(24):
        status = train_in_child(folder, 10**6, kill_at=rng.randint(1, 120))
        assert killed(status)
        last, best = assert_recovered(folder)
        assert last >= committed  # an epoch once committed is never lost
        assert best == (expected_best(last) if last else None)
        committed = last
    assert committed > 0, "no kill happened after the first commit: the test proved nothing"
    assert finished(train_in_child(folder, committed + 3))
    assert_no_temp_files(folder)
    assert assert_recovered(folder) == (committed + 3, expected_best(committed + 3))


EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "plain_training_loop.py"
RUN_EXAMPLE_KILLED = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from crash_harness import die_at_write
die_at_write(int(sys.argv[4]))
runpy.run_path(sys.argv[2])["main"](sys.argv[3], num_epochs=6, patience=None)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [4, 5, 40])
def test_kill_9_of_the_documented_example_then_resume(tmp_path: Path, kill_at: int) -> None:
    """The real script of docs/examples, killed at a chosen write (4 and 5: between the
    files of its first checkpoint set), then run to the end."""
    import runpy
    import sqlite3
    import subprocess

    from crash_harness import assert_csv_matches_sqlite

    here = str(Path(__file__).parent)
    command = [sys.executable, "-c", RUN_EXAMPLE_KILLED, here, str(EXAMPLE), str(tmp_path)]
    process = subprocess.run([*command, str(kill_at)], timeout=300)
    assert process.returncode == -signal.SIGKILL

    hooks = runpy.run_path(str(EXAMPLE))["main"](tmp_path, num_epochs=6, patience=None)
    history = hooks.get_accuracy_history(None, "val")
    assert history["epoch"] == [1, 2, 3, 4, 5, 6]
    with sqlite3.connect(tmp_path / "logs" / "records.db") as conn:
        sql = "SELECT count(*), count(DISTINCT step) FROM records WHERE name = 'metric_loss'"
        (total, distinct) = conn.execute(sql).fetchone()
    assert total == distinct == 6 * 4
    assert_csv_matches_sqlite(tmp_path)
    assert_no_temp_files(tmp_path)
    best_epoch, best = hooks.get_best_epoch_and_accuracy(None, "val")
    assert best == max(history["precision_at_1_level0"])
    saved = sorted(p.name for p in (tmp_path / "saved_models").glob("*best*.pth"))
    assert saved == [f"trunk_best{best_epoch}.pth", f"trunk_optimizer_best{best_epoch}.pth"]
