"""Make every system call of an epoch's save fail in turn; nothing is ever lost.

The calls that write state are counted during one clean save (file writes, fsync,
os.replace, SQLite commits); then, for each of them and each error (disk full, I/O error,
permission denied), a fresh run fails exactly there. Afterwards a new process must find the
previous best model loadable, resume with the same best epoch, hold every record once,
CSV agreeing with SQLite, and after its next successful save no temporary file remains.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest
from crash_harness import Run, assert_no_temp_files, assert_recovered

from pytorch_metric_learning.utils import _record_csv
from pytorch_metric_learning.utils.record_keeping import SQLiteManager

ERRORS: dict[str, Callable[[], BaseException]] = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "EIO": lambda: OSError(errno.EIO, "Input/output error"),
    "EACCES": lambda: PermissionError(errno.EACCES, "Permission denied"),
    "sqlite-full": lambda: sqlite3.OperationalError("database or disk is full"),
}


class Injector:
    """Counts the state-writing calls and raises at call number ``fail_at`` (None: never)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int | None, error: str) -> None:
        self.calls: list[str] = []
        self.fail_at, self.error, self.failed = fail_at, error, False
        self._wrap(monkeypatch, os, "replace", "replace")
        self._wrap(monkeypatch, os, "fsync", "fsync")
        original_fdopen, original_open = os.fdopen, open
        monkeypatch.setattr(os, "fdopen", lambda *a, **k: _Handle(original_fdopen(*a, **k), self))
        monkeypatch.setattr(
            _record_csv,
            "open",
            lambda *a, **k: _Handle(original_open(*a, **k), self),
            raising=False,
        )
        original_commit = SQLiteManager._commit

        def commit(conn: sqlite3.Connection) -> None:
            self.tick("sqlite commit")
            original_commit(conn)

        monkeypatch.setattr(SQLiteManager, "_commit", staticmethod(commit))

    def tick(self, what: str) -> None:
        self.calls.append(what)
        if len(self.calls) == self.fail_at:
            self.failed = True
            error = ERRORS[self.error]()
            if isinstance(error, sqlite3.Error) != (what == "sqlite commit"):
                error = OSError(errno.ENOSPC, "No space left on device")
            raise error

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, module: Any, name: str, what: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.tick(what)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)


class _Handle:
    """A file object whose first write passes through the injector (torch.save writes
    many small pieces; failing the first or any later one is the same event)."""

    def __init__(self, handle: Any, injector: Injector) -> None:
        self._handle, self._injector, self._written = handle, injector, False

    def write(self, data: Any) -> Any:
        if not self._written:
            self._written = True
            self._injector.tick("write")
        return self._handle.write(data)

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


@pytest.fixture(autouse=True)
def no_real_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync is about power cuts, not this logic; skipping the real one keeps the suite fast."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def save_epoch_with_fault(root: Path, fail_at: int | None, error: str) -> Injector:
    """Train epochs 1-2 cleanly, then epoch 3 (a new best) with a fault at ``fail_at``."""
    run = Run(root)
    run.train(2)
    with pytest.MonkeyPatch.context() as patch:
        injector = Injector(patch, fail_at, error)
        try:
            run.epoch(3)
        except (OSError, sqlite3.Error, ValueError):
            assert injector.failed
    run.close()
    return injector


def count_calls(root: Path) -> list[str]:
    injector = save_epoch_with_fault(root, None, "ENOSPC")
    assert {"write", "fsync", "replace", "sqlite commit"} <= set(injector.calls)
    assert len(injector.calls) > 20
    return injector.calls


def check_points(root: Path, error: str, points: list[int]) -> None:
    for fail_at in points:
        case = root / f"fail{fail_at}"
        assert save_epoch_with_fault(case, fail_at, error).failed
        last, best = assert_recovered(case)
        assert (last, best) in [(2, 1), (3, 3)], (fail_at, last, best)
        run = Run(case)
        run.train(4)
        run.close()
        assert_no_temp_files(case)
        assert assert_recovered(case) == (4, 3)


def test_disk_full_at_sampled_points_of_a_save(folder: Path) -> None:
    calls = count_calls(folder / "count")
    check_points(folder, "ENOSPC", list(range(1, len(calls) + 1, 7)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "error, kinds, stride",
    [
        ("ENOSPC", {"write", "fsync", "replace", "sqlite commit"}, 1),
        ("EIO", {"write", "fsync", "replace"}, 2),
        ("EACCES", {"replace", "write"}, 2),
        ("sqlite-full", {"sqlite commit"}, 1),
    ],
)
def test_errors_at_every_point_of_a_save(
    folder: Path, error: str, kinds: set[str], stride: int
) -> None:
    calls = count_calls(folder / "count")
    points = [i for i, what in enumerate(calls, start=1) if what in kinds]
    check_points(folder, error, points[::stride])
