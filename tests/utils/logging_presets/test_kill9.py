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
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_no_temp_files(folder)
    assert assert_recovered(folder) == (committed + 3, expected_best(committed + 3))
