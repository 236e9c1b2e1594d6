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
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._atomic import remove_leftovers, write_atomically, write_error

__all__ = ["csv_text", "append_rows", "rewrite_file", "remove_csv_leftovers"]

_CSV_FILE = re.compile(r".+\.csv")


def csv_text(rows: Iterable[tuple[int, float]], header: Sequence[str] | None = None) -> str:
    """The CSV lines of ``(step, value)`` rows, values written with ``repr`` (exact)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows([step, repr(float(value))] for step, value in rows)
    return buffer.getvalue()


def append_rows(path: Path, header: Sequence[str], rows: Sequence[tuple[int, float]]) -> None:
    """Append rows to a metric's file, writing the header first into a new or empty file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        with open(path, "a", encoding="utf-8", newline="") as handle:
            handle.write(csv_text(rows, header if new else None))
    except OSError as error:
        raise write_error(path, error, "CSV file") from error


def rewrite_file(path: Path, header: Sequence[str], rows: Iterable[tuple[int, float]]) -> None:
    """Replace a metric's file by ``header`` and ``rows``, atomically."""
    data = csv_text(rows, header).encode("utf-8")
    write_atomically(path, lambda handle: handle.write(data), "CSV file")


def remove_csv_leftovers(folders: Iterable[Path]) -> None:
    """Remove the temporary CSV files that interrupted saves left in ``folders``."""
    for folder in set(folders):
        remove_leftovers(folder, _CSV_FILE)
