"""Write a file so that a reader sees the old version or the new one, never half of either.

The bytes go to a temporary file ``.<name>.<8 lowercase hex digits>.tmp`` in the target's folder
(same file system; created with mode 0o666, so the umask applies exactly as for ``open``),
are flushed and fsynced, and the temporary file is renamed over the target with
:func:`os.replace`, which is atomic on POSIX and Windows. On any failure the temporary
file is removed and the error is raised as :class:`~pytorch_metric_learning.errors.
FileWriteError` naming the target. A process killed mid-write leaves its temporary file
behind; the next successful write removes such leftovers (only names of this exact form
whose target matches, so no other file is ever touched).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
from pathlib import Path
from typing import IO, Callable

from .errors import FileWriteError

__all__ = [
    "FileWriteError",
    "atomic_write",
    "atomic_write_text",
    "fsync_folder",
    "make_folder",
    "remove_leftovers",
    "write_atomically",
    "write_error",
]

logger = logging.getLogger(__name__)

_LEFTOVER = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{8}\.tmp")  # secrets.token_hex(4)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write`` on a binary temporary file, then move it onto ``path`` atomically.

    Parent folders are created; leftovers of killed writes of ``path`` are removed.

    Raises:
        FileWriteError: naming ``path`` (an ``OSError`` keeping the cause's errno); any
            previous file there is unchanged.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "out" / "x.txt"
        >>> atomic_write(target, lambda handle: handle.write(b"hi")).read_bytes()
        b'hi'
    """
    path = Path(path)
    write_atomically(path, write)
    fsync_folder(path.parent)
    remove_leftovers(path.parent, re.compile(re.escape(path.name)))
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write`).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.json"
        >>> atomic_write_text(target, "{}").read_text()
        '{}'
    """
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def write_error(path: Path, error: BaseException, what: str = "file") -> FileWriteError:
    """A :class:`FileWriteError` naming ``path`` and the cause, keeping its errno."""
    wrapped = FileWriteError(
        f"Could not write the {what} {str(path)!r}: {_reason(error, path)}. "
        "Any previous version there is intact."
    )
    wrapped.errno = getattr(error, "errno", None)
    return wrapped


def make_folder(folder: Path, what: str = "folder") -> None:
    """Create ``folder`` (and its parents) if needed; a failure (a file of that name, a
    read-only parent) is raised as :class:`FileWriteError` naming the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        wrapped = FileWriteError(f"Could not create the {what} {str(folder)!r} ({error}).")
        wrapped.errno = error.errno
        raise wrapped from error


def write_atomically(path: Path, write: Callable[[IO[bytes]], object], what: str = "file") -> None:
    """Write ``path`` with ``write(handle)`` through a synced temporary file and a rename."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        _unlink_quietly(tmp)
        cause = _os_error_in(error)
        if cause is None:
            raise
        raise write_error(path, cause, what) from error


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable.

    Platforms that cannot open a folder (Windows) or fsync one (some file systems answer
    EINVAL) are skipped; a real I/O error is raised as :class:`FileWriteError`.
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise write_error(folder, error, "folder") from error
    finally:
        os.close(fd)


def remove_leftovers(folder: Path, target: re.Pattern[str]) -> list[Path]:
    """Remove ``.<name>.<random>.tmp`` files of crashed saves whose ``<name>`` matches
    ``target``; return what was removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            found = _LEFTOVER.fullmatch(entry.name)
            if found and target.fullmatch(found["target"]) and entry.is_file(follow_symlinks=False):
                _unlink_quietly(Path(entry.path))
                removed.append(Path(entry.path))
    if removed:
        logger.info("Removed %d temporary files left by an interrupted save", len(removed))
    return removed


def _reason(error: BaseException, path: Path) -> str:
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return f"'{blocking}' is a file, not a folder"
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _os_error_in(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error``: torch.save, say, turns a failed write into a
    RuntimeError raised while it cleans up, with the OSError as its context."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, OSError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
