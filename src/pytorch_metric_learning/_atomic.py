"""Write a file all at once: the old content or the new one, never half of either.

The new content goes to a temporary file in the destination's folder (same file system),
is flushed and fsynced, and then replaces the destination with :func:`os.replace`, which is
atomic on POSIX and Windows. If anything fails, the temporary file is removed, the
destination is left as it was, and the error names the destination. A successful write
also removes the temporary files that killed writes of the same destination left behind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Callable

from .errors import PMLError

__all__ = ["FileWriteError", "atomic_write", "atomic_write_text"]


class FileWriteError(PMLError, OSError):
    """A file could not be written; the previous file at that path is unchanged."""


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write`` on a binary temporary file, then move it onto ``path`` atomically.

    Parent folders are created. Raises :class:`FileWriteError` naming ``path`` (with the
    original ``OSError`` as its cause) when the file cannot be written.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "out" / "x.txt"
        >>> atomic_write(target, lambda handle: handle.write(b"hi")).read_bytes()
        b'hi'
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _temporary_beside(path) as (handle, temporary):
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.replace(temporary, path)
    except OSError as error:
        raise FileWriteError(
            f"Cannot write '{path}': {_reason(error, path)}. Any previous file there is unchanged."
        ) from error
    _fsync_folder(path.parent)
    _remove_leftovers(path)
    return path


def _remove_leftovers(path: Path) -> None:
    """Temporary files of ``path`` from writes that were killed (``kill -9``) half-way."""
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def _reason(error: OSError, path: Path) -> str:
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return f"'{blocking}' is a file, not a folder"
    return error.strerror or str(error) or type(error).__name__


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write`).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.json"
        >>> atomic_write_text(target, "{}").read_text()
        '{}'
    """
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[tuple[IO[bytes], str]]:
    """A new hidden ``.NAME.*.tmp`` file in ``path``'s folder, removed unless it was moved."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    handle = os.fdopen(fd, "wb")
    try:
        _follow_umask(fd)
        yield handle, temporary
    finally:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _follow_umask(fd: int) -> None:
    """``mkstemp`` makes files 0600; give the result the mode a plain ``open`` would."""
    if os.name != "posix":  # pragma: no cover
        return
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); folders cannot be opened on Windows."""
    if os.name != "posix":  # pragma: no cover
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
