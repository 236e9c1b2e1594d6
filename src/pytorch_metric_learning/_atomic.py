"""The one policy by which the library writes a file: it never harms a file it does not own.

* A **missing path or a regular file** is replaced atomically: the bytes go to a temporary
  file ``.<name>.<8 lowercase hex digits>.tmp`` in the target's folder (same file system),
  are flushed and fsynced, and the temporary file is renamed over the target with
  :func:`os.replace`. A reader sees the old version or the new one, never a mix. The new
  file keeps the old one's mode (and, where permitted, its owner); a new file gets
  ``0o666`` less the umask, exactly as ``open`` gives.
* A **symbolic link** is never written through: a link to a regular file (or a dangling
  one) is itself replaced, so the file it pointed to, maybe outside the folder, is
  untouched. A link that leads to something other than a regular file (``/dev/stdout``),
  and any link in ``/dev`` or ``/proc``, is treated as the special file it names.
* A **FIFO, a device or a socket** is never replaced: with ``in_place=True`` (the command
  line's outputs, as the shell's ``>`` does) it is opened and written in place; otherwise
  the write is refused with :class:`~pytorch_metric_learning.errors.FileWriteError`. A
  folder is always refused.
* A temporary name that exists already is never removed: another is drawn. On a failure
  only the temporary file this call created is removed, and the error is raised as
  :class:`FileWriteError` naming the target. The temporary file is locked
  (``fcntl.flock``) while it is written, so the clean-up of leftovers of killed writes
  (:func:`remove_leftovers`) never removes a file that a live writer is still writing.
* Appends (:func:`append_bytes`) never follow a symbolic link (``O_NOFOLLOW``) and refuse
  anything that is not a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
from pathlib import Path
from typing import IO, Callable

from .errors import FileWriteError

try:  # POSIX only: elsewhere a live temporary file cannot be told from a leftover.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "FileWriteError",
    "append_bytes",
    "atomic_write",
    "atomic_write_text",
    "atomic_save_to_path",
    "fsync_folder",
    "kind_of",
    "kind_of_mode",
    "make_folder",
    "path_kind",
    "refuse_linked_folders",
    "remove_leftovers",
    "write_atomically",
    "write_error",
]

logger = logging.getLogger(__name__)

_LEFTOVER = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{8}\.tmp")  # secrets.token_hex(4)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_SPECIAL_FOLDERS = ("/dev", "/proc")
_TEMP_TRIES = 100
_NOT_REGULAR = "it is not a regular file (a FIFO, a device or a link to one)"


def atomic_write(
    path: str | os.PathLike[str],
    write: Callable[[IO[bytes]], object],
    *,
    in_place: bool = False,
) -> Path:
    """Write ``path`` with ``write(handle)`` under the policy above; return ``path``.

    Parent folders are created; leftovers of killed writes of ``path`` are removed.

    Args:
        path: the target.
        write: called once with a binary handle.
        in_place: write a FIFO or a device in place (as ``>`` does) instead of refusing.

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
    if write_atomically(path, write, in_place=in_place):
        fsync_folder(path.parent)
        remove_leftovers(path.parent, re.compile(re.escape(path.name)))
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, in_place: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``path`` (see :func:`atomic_write`).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.json"
        >>> atomic_write_text(target, "{}").read_text()
        '{}'
    """
    data = text.encode("utf-8")
    return atomic_write(path, lambda handle: handle.write(data), in_place=in_place)


def atomic_save_to_path(
    path: str | os.PathLike[str], save: Callable[[str], object], what: str = "file"
) -> Path:
    """:func:`atomic_write` for a writer that takes a file *name* (``faiss.write_index``, a
    backend's ``save(path)``): ``save`` gets the name of the temporary file this call
    created, which is then renamed onto ``path``. Special files are refused.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "index.bin"
        >>> atomic_save_to_path(target, lambda name: Path(name).write_bytes(b"ix")).read_bytes()
        b'ix'
    """
    path = Path(path)
    kind = path_kind(path)
    if kind in ("folder", "special"):
        raise _refused(path, what, "it is a folder" if kind == "folder" else _NOT_REGULAR)
    keep = _mode_to_keep(path) if kind == "file" else None
    _replace_through_temp(path, lambda _handle, name: save(name), what, keep)
    fsync_folder(path.parent)
    remove_leftovers(path.parent, re.compile(re.escape(path.name)))
    return path


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


def path_kind(path: Path) -> str:
    """What is at ``path``, as the policy sees it: ``"missing"``, ``"file"`` (a regular
    file), ``"link"`` (a link that may be replaced), ``"folder"`` or ``"special"`` (a FIFO,
    a device, a socket, or a link to one or into ``/dev`` or ``/proc``).

    Example:
        >>> path_kind(Path("/dev/null")), path_kind(Path("/no/such/file"))
        ('special', 'missing')
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "missing" if not path.parent.is_dir() else "special"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if not stat.S_ISLNK(mode):
        return "special"
    if _in_special_folder(path):
        return "special"
    try:
        target = os.stat(path).st_mode
    except OSError:
        return "link"  # dangling: replacing the link harms nothing
    if stat.S_ISREG(target):
        return "link"
    return "folder" if stat.S_ISDIR(target) else "special"


def write_atomically(
    path: Path,
    write: Callable[[IO[bytes]], object],
    what: str = "file",
    *,
    in_place: bool = False,
) -> bool:
    """Write ``path`` with ``write(handle)`` under the module's policy.

    Returns:
        True when the file was replaced through a temporary file (the caller may fsync
        the folder), False when a special file was written in place.

    Raises:
        FileWriteError: naming ``path``; also for a folder, and for a FIFO or a device
            without ``in_place``.
    """
    kind = path_kind(path)
    if kind == "folder":
        raise _refused(path, what, "it is a folder")
    if kind == "special":
        if not in_place:
            raise _refused(path, what, _NOT_REGULAR)
        _write_in_place(path, write, what)
        return False
    keep = _mode_to_keep(path) if kind == "file" else None
    _replace_through_temp(path, lambda handle, _name: write(handle), what, keep)
    return True


def append_bytes(path: Path, data: bytes, what: str = "file") -> None:
    """Append ``data`` to the regular file ``path`` (created if missing), never through a
    symbolic link (``O_NOFOLLOW``) and never into a FIFO or a device.

    Raises:
        FileWriteError: naming ``path``: it is a link, not a regular file, or the write
            failed.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _BINARY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _refused(path, what, "it is a symbolic link") from error
        raise write_error(path, error, what) from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _refused(path, what, "it is not a regular file")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as error:
        if isinstance(error, FileWriteError):
            raise
        raise write_error(path, error, what) from error
    finally:
        os.close(fd)


def refuse_linked_folders(root: Path, path: Path, what: str = "file") -> None:
    """Raise FileWriteError when a folder between ``root`` and ``path`` (``root`` itself
    excluded, ``path`` itself excluded) is a symbolic link or not a folder.

    ``O_NOFOLLOW`` guards only the last component: a group folder ``<root>/g`` linked to
    ``/tmp/outside`` would let an append or a rebuild land outside ``root``. Missing
    folders are fine (they are created as real folders).
    """
    relative = Path(os.path.relpath(path.parent, root))
    if relative.parts[:1] == ("..",):
        raise _refused(path, what, f"it is not inside {str(root)!r}")
    current = root
    for part in relative.parts:
        if part == ".":
            continue
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        except OSError as error:
            raise write_error(path, error, what) from error
        if stat.S_ISLNK(mode):
            raise _refused(path, what, f"its folder {str(current)!r} is a symbolic link")
        if not stat.S_ISDIR(mode):
            raise _refused(path, what, f"{str(current)!r} is not a folder")


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
    """Remove ``.<name>.<random>.tmp`` files of killed saves whose ``<name>`` matches
    ``target``; return what was removed. A temporary file that a live writer holds
    locked (this process or another) is left alone."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            found = _LEFTOVER.fullmatch(entry.name)
            if not (found and target.fullmatch(found["target"])):
                continue
            if entry.is_file(follow_symlinks=False) and _unlink_if_abandoned(Path(entry.path)):
                removed.append(Path(entry.path))
    if removed:
        logger.info("Removed %d temporary files left by an interrupted save", len(removed))
    return removed


# ---------------------------------------------------------------------------- internals
def _replace_through_temp(
    path: Path,
    write: Callable[[IO[bytes], str], object],
    what: str,
    keep: os.stat_result | None,
) -> None:
    """Create a temporary file, ``write(handle, its name)``, sync it, rename it onto
    ``path``. The handle stays open (and locked) until the rename."""
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = _create_temp(path)
        with os.fdopen(fd, "wb") as handle:
            _lock(fd)
            if keep is not None:
                _keep_mode(fd, keep)
            write(handle, str(tmp))
            handle.flush()
            _fsync_name(tmp, fd)
            os.replace(tmp, path)
            tmp = None  # renamed: the name is no longer ours
    except BaseException as error:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        cause = _os_error_in(error)
        if cause is None:
            raise
        raise write_error(path, cause, what) from error


def _fsync_name(tmp: Path, fd: int) -> None:
    """fsync what was written through ``fd`` and, if a writer wrote the name itself, that."""
    os.fsync(fd)
    with contextlib.suppress(OSError):
        other = os.open(tmp, os.O_RDONLY | _NOFOLLOW)
        try:
            os.fsync(other)
        finally:
            os.close(other)


def _create_temp(path: Path) -> tuple[Path, int]:
    """A new temporary file next to ``path``; a name that exists is never reused."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY
    for _ in range(_TEMP_TRIES):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def _write_in_place(path: Path, write: Callable[[IO[bytes]], object], what: str) -> None:
    """Open a FIFO or a device as ``>`` does and write into it. A FIFO without a reader
    is refused at once (``O_NONBLOCK``) instead of blocking forever."""
    try:
        fd = os.open(path, os.O_WRONLY | _NONBLOCK | _BINARY)
    except OSError as error:
        if error.errno == errno.ENXIO:
            found = kind_of(path)
            why = (
                "it is a FIFO that no process reads"
                if found == "a FIFO"
                else f"it is {found} with no device behind it"
            )
            raise _refused(path, what, why) from error
        raise _stream_error(path, error, what) from error
    try:
        if fcntl is not None:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~_NONBLOCK)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
    except OSError as error:
        raise _stream_error(path, error, what) from error


def _stream_error(path: Path, error: OSError, what: str) -> FileWriteError:
    """A failed write into a FIFO or a device: it was written in place, so unlike
    :func:`write_error` nothing can be said to be intact (a reader may have got a part)."""
    wrapped = FileWriteError(
        f"Could not write the {what} {str(path)!r} ({kind_of(path)}, written in place): "
        f"{_reason(error, path)}. A reader may have received part of it."
    )
    wrapped.errno = error.errno
    return wrapped


def kind_of(path: Path) -> str:
    """What ``path`` leads to, in words (``"a block device"``); links are followed, as
    an in-place write follows them."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    return kind_of_mode(mode)


def kind_of_mode(mode: int) -> str:
    """A reader's name for what a ``st_mode`` is (``"a symbolic link"``, ``"a FIFO"``)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _mode_to_keep(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _keep_mode(fd: int, old: os.stat_result) -> None:
    """Give the new file the old one's mode and, where permitted, its owner."""
    if hasattr(os, "fchown") and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
        with contextlib.suppress(OSError):
            os.fchown(fd, old.st_uid, old.st_gid)
    if hasattr(os, "fchmod"):  # POSIX; elsewhere only the read-only bit exists
        os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _lock(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlink_if_abandoned(path: Path) -> bool:
    """Remove a temporary file unless a live writer holds its lock."""
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live writer's
        finally:
            os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def _in_special_folder(path: Path) -> bool:
    folder = os.path.abspath(path.parent)
    return any(folder == top or folder.startswith(top + os.sep) for top in _SPECIAL_FOLDERS)


def _refused(path: Path, what: str, why: str) -> FileWriteError:
    error = FileWriteError(
        f"Refusing to write the {what} {str(path)!r}: {why}; it was left as it is. "
        "Give the path of a regular file (or a new one)."
    )
    error.errno = errno.EEXIST
    return error


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
