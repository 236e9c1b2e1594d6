"""One run owns its folders: an advisory lock (``fcntl.flock``) on a model or record folder.

The lock is taken on the folder itself (an open file descriptor of the folder), so no file
is added to it; a second process is told which process holds it (read from
``/proc/locks`` where the system has it). The kernel releases a ``flock`` when its process
dies, so a lock left by a killed run never blocks the next one.
Within one process, locks of one folder are shared (counted): a process may open several
record keepers on its own folder. On platforms without ``fcntl`` (Windows) nothing is
locked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from ._atomic import make_folder
from .errors import FolderInUseError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["FolderLock", "lock_folder", "holder_pid"]

logger = logging.getLogger(__name__)

_PROC_LOCKS = "/proc/locks"

_held: dict[tuple[int, str], _Held] = {}
_guard = threading.Lock()


class _Held:
    """One open, locked lock file of this process and how many holders share it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0


class FolderLock:
    """A held lock on one folder; :meth:`release` (or garbage collection) gives it up.

    Example:
        >>> import tempfile
        >>> lock = lock_folder(tempfile.mkdtemp(), "model folder")
        >>> lock.release()
    """

    def __init__(self, key: tuple[int, str], folder: Path) -> None:
        self.key = key
        self.folder = folder
        self._released = False

    def release(self) -> None:
        """Give the lock up (the file stays; an unlocked file blocks nobody)."""
        if self._released:
            return
        self._released = True
        _drop(self.key)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        return f"FolderLock({str(self.folder)!r})"


def lock_folder(folder: str | os.PathLike[str], what: str) -> FolderLock:
    """Lock ``folder`` (created if needed) for this process.

    Args:
        folder: the model or record folder.
        what: the folder's role in messages, e.g. ``"record folder"``.

    Raises:
        FolderInUseError: another live process holds the folder; the message names the
            folder and that process's PID.
    """
    path = Path(folder)
    make_folder(path, what)
    key = (os.getpid(), os.path.realpath(path))
    with _guard:
        held = _held.get(key)
        if held is None:
            held = _Held(_acquire(path, what))
            _held[key] = held
        held.count += 1
    return FolderLock(key, path)


def _acquire(folder: Path, what: str) -> int:
    if fcntl is None:  # pragma: no cover - Windows: nothing is locked
        return -1
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = holder_pid(folder)
        os.close(fd)
        raise FolderInUseError(
            f"The {what} {str(folder)!r} is in use by another process (PID "
            f"{holder if holder is not None else 'unknown'}), which holds its lock: two "
            "runs in one folder would mix their checkpoints and records. Wait for that "
            "run to end, or give this run another folder. Nothing was written or loaded."
        ) from error
    return fd


def holder_pid(folder: str | os.PathLike[str]) -> int | None:
    """The PID of the process holding the ``flock`` of ``folder`` (None when unknown)."""
    try:
        info = os.stat(folder)
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5] == device and fields[4].isdigit():
            return int(fields[4])
    return None


def _drop(key: tuple[int, str]) -> None:
    with _guard:
        held = _held.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _held[key]
    if key[0] == os.getpid() and held.fd >= 0:  # a forked child never unlocks its parent's
        with contextlib.suppress(OSError):
            os.close(held.fd)
