"""kill -9 a training process at seeded random moments; every restart loses nothing.

A child process (forked from the test, so it starts in milliseconds instead of importing
torch again) resumes the run in a shared folder and trains; the test SIGKILLs it after a
random delay, then checks in a fresh record keeper and hooks what a user would rely on:
the previous best model loads, resume continues with the same best epoch, every record is
there once with its true value, CSV agrees with SQLite, and a committed epoch is never lost.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_harness import Run, assert_no_temp_files, assert_recovered, expected_best

pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork and SIGKILL"
)

KILLS = 24
NEVER = 10**6  # the child trains until it is killed


def train_in_child(root: Path, last_epoch: int) -> int:
    """Fork a process that resumes and trains up to ``last_epoch``; return its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            run = Run(root)
            run.train(last_epoch)
            run.close()
            code = 0
        finally:
            os._exit(code)
    return pid


def wait_for(pid: int, timeout: float) -> int:
    """The child's exit code; a child still running after ``timeout`` is killed and fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the training child {pid} did not finish in {timeout} s")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """In memory where possible: SQLite's own syncs would dominate on a busy disk."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as name:
        yield Path(name)


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing(folder: Path) -> None:
    rng = random.Random(12)
    committed = 0
    for _ in range(KILLS):
        pid = train_in_child(folder, NEVER)
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        last, best = assert_recovered(folder)
        assert last >= committed  # an epoch once committed is never lost
        assert best == (expected_best(last) if last else None)
        committed = last
    assert committed > 0, "no kill happened after the first save: the test proved nothing"
    pid = train_in_child(folder, committed + 3)
    assert wait_for(pid, timeout=120) == 0
    assert_no_temp_files(folder)
    assert assert_recovered(folder) == (committed + 3, expected_best(committed + 3))


EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "plain_training_loop.py"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_of_the_documented_example_then_resume(tmp_path: Path, seed: int) -> None:
    """The real script of docs/examples, killed once mid-training, then run to the end."""
    import runpy
    import sqlite3
    import subprocess

    from crash_harness import assert_csv_matches_sqlite

    process = subprocess.Popen([sys.executable, str(EXAMPLE), str(tmp_path)])
    deadline = time.monotonic() + 120
    while not (tmp_path / "logs" / "records.db").exists() and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))
    process.kill()
    process.wait()

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
