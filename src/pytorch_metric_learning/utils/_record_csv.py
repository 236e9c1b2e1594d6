"""The CSV side of the records: one file per metric, derived from SQLite.

SQLite is the source of truth. In the same transaction that stores rows, the (group, name)
of every file they touch is marked in the table ``csv_pending``; the mark is removed only
after the file has its rows. A new row whose step is later than every stored step of its
metric is appended; anything else (a repeated or an earlier step, a file marked by a save
that failed or was killed) rebuilds the file from SQLite, atomically. So after any failure
the next save (or the next :class:`RecordKeeper`) brings every CSV file back in line with
SQLite, and a row is never in a CSV file twice.
"""

from __future__ import annotations

import csv
import io
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._atomic import append_bytes, remove_leftovers, write_atomically, write_error
from ..errors import FileWriteError

__all__ = ["csv_text", "append_rows", "rewrite_file", "remove_csv_leftovers", "tail_agrees"]

_TAIL = 4096  # bytes read from the end of a file to find its last row

_CSV_FILE = re.compile(r".+\.csv")


def csv_text(rows: Iterable[tuple[int, float]], header: Sequence[str] | None = None) -> str:
    """The CSV lines of ``(step, value)`` rows, values written with ``repr`` (exact)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows([step, repr(float(value))] for step, value in rows)
    return buffer.getvalue()


def append_rows(path: Path, rows: Sequence[tuple[int, float]]) -> None:
    """Append rows to a metric's regular file, never through a symbolic link (check the
    file with :func:`tail_agrees` first)."""
    try:
        append_bytes(path, csv_text(rows).encode("utf-8"), "CSV file")
    except FileWriteError:
        raise
    except OSError as error:
        raise write_error(path, error, "CSV file") from error


def tail_agrees(path: Path, header: Sequence[str], last_step: int | None) -> bool:
    r"""Whether rows may be appended to ``path``: it is a regular file (not a link, with
    no second name: a hard link), it
    ends with a full line, and that line is the row of ``last_step`` (the header when
    ``last_step`` is None). Anything else means the file must be rebuilt from SQLite.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "loss.csv"
        >>> _ = path.write_text("step,loss\n1,0.5\n3,0.25\n")
        >>> tail_agrees(path, ["step", "loss"], 3), tail_agrees(path, ["step", "loss"], 1)
        (True, False)
    """
    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            return False  # a hard link is rebuilt as a new file: the other name keeps its bytes
        start = max(0, info.st_size - _TAIL)
        os.lseek(fd, start, os.SEEK_SET)
        tail = os.read(fd, info.st_size - start)
    except OSError:
        return False
    finally:
        os.close(fd)
    if last_step is None:
        return tail == csv_text([], header).encode("utf-8")
    lines = tail.split(b"\n")
    if len(lines) < 2 or lines[-1] != b"":
        return False
    try:
        row = next(csv.reader([lines[-2].decode("utf-8")]))
    except (UnicodeDecodeError, StopIteration, csv.Error):
        return False
    return len(row) == 2 and row[0] == str(last_step)


def rewrite_file(path: Path, header: Sequence[str], rows: Iterable[tuple[int, float]]) -> None:
    """Replace a metric's file by ``header`` and ``rows``, atomically."""
    data = csv_text(rows, header).encode("utf-8")
    write_atomically(path, lambda handle: handle.write(data), "CSV file")


def remove_csv_leftovers(folders: Iterable[Path]) -> None:
    """Remove the temporary CSV files that interrupted saves left in ``folders``."""
    for folder in set(folders):
        remove_leftovers(folder, _CSV_FILE)
