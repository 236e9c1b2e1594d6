"""Train onto a real, small file system until it is full, then free space and go on.

Needs root (to mount a 2 MiB tmpfs); skipped elsewhere. A full disk must stop training
with the library's ``FileWriteError`` (an ``OSError`` with ``errno.ENOSPC``) naming the
file, lose nothing that was saved before, and let a resumed run continue from the last
committed epoch once space is freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_harness import Run, assert_no_temp_files, assert_recovered

from pytorch_metric_learning.errors import FileWriteError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or os.geteuid() != 0, reason="mounts a tmpfs: Linux, root"
    ),
]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace')}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=60)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` but ``leave`` bytes; return the filler file."""
    filler = disk / "filler"
    room = max(shutil.disk_usage(disk).free - leave, 0)
    with open(filler, "wb") as handle, contextlib.suppress(OSError):
        handle.write(b"\0" * room)
    return filler


@pytest.mark.parametrize("reopen", [False, True], ids=["open", "reopened"])
@pytest.mark.parametrize("leave_kib", [0, 16, 64])
def test_full_disk_stops_training_and_loses_nothing(
    small_disk: Path, leave_kib: int, reopen: bool
) -> None:
    root = small_disk / "run"
    run = Run(root)
    run.train(3)
    if reopen:  # a new process starts on the full disk (SQLite reports an I/O error)
        run.close()
    filler = fill(small_disk, leave_kib * 1024)
    with pytest.raises(FileWriteError) as caught:
        if reopen:
            run = Run(root)  # may already fail: SQLite cannot open its WAL index
        run.train(10**6)  # until the disk is full
    assert caught.value.errno == errno.ENOSPC
    assert "full" in str(caught.value)
    assert str(root) in str(caught.value)
    assert isinstance(caught.value, OSError)
    filler.unlink()
    run.close()  # writes what was still queued, now that there is room (or closes again)
    last, _ = assert_recovered(root)  # the best loads, records once each, CSV == SQLite
    assert last >= 3
    again = Run(root)
    again.train(last + 2)
    again.close()
    assert_recovered(root)
    assert_no_temp_files(root)
