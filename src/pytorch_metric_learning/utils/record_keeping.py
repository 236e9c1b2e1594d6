"""Keep training records (losses, accuracies) in CSV files, SQLite and, optionally, TensorBoard.

A record is one number: its *group* (``"accuracies_val"``, ``"loss_histories"``), its *name*
(``"precision_at_1_level0"``), the *step* it belongs to (an epoch or an iteration) and its
value. :class:`RecordKeeper` buffers records and writes them on :meth:`RecordKeeper.save_records`:

* to one SQLite database, a single table ``records(record_group, name, step, value,
  wall_time)``. Group and metric names are bound as statement parameters, never pasted
  into SQL, so any characters are safe; writing a (group, name, step) a second time
  replaces the value (a resumed run that repeats an epoch does not duplicate it);
* to one CSV file per metric, ``<csv_folder>/<group>/<name>.csv`` with the header
  ``<step name>,<metric name>``; a name that is not a plain file name is rewritten to a
  safe one with a short hash of the original, which stays readable in the header;
* to TensorBoard, as scalars tagged ``<group>/<name>``, when a writer is given.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import numbers
import os
import re
import sqlite3
import tempfile
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Union

import torch

from .._validation import invalid
from ..errors import BackendNotInstalledError, InvalidTypeError

__all__ = ["Record", "SQLiteManager", "RecordKeeper", "make_tensorboard_writer", "safe_file_name"]

PathLike = Union[str, "os.PathLike[str]"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    record_group TEXT NOT NULL,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    value REAL,
    wall_time REAL NOT NULL,
    PRIMARY KEY (record_group, name, step)
)
"""
_UPSERT = (
    "INSERT INTO records (record_group, name, step, value, wall_time) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (record_group, name, step) DO UPDATE "
    "SET value = excluded.value, wall_time = excluded.wall_time"
)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_\-]{1,100}")


class Record(NamedTuple):
    """One recorded number."""

    group: str
    name: str
    step: int
    value: float
    wall_time: float


def safe_file_name(name: str) -> str:
    """A file name for ``name`` that cannot leave its folder or collide with another name.

    Plain names (letters, digits, ``_``, ``-``) are kept; anything else is replaced by
    ``_`` and followed by a hash of the original name.

    Example:
        >>> safe_file_name("precision_at_1_level0")
        'precision_at_1_level0'
        >>> safe_file_name("../a b")
        '___a_b-3f08b21409'
    """
    if _PLAIN_NAME.fullmatch(name):
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_\-]", "_", name)[:80] + "-" + digest


def _open(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode: a commit is atomic and survives a crash of the process
    without an fsync per commit (a power cut may lose the last commits, never the file)."""
    conn = sqlite3.connect(path, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_SCHEMA)
    conn.commit()
    return conn


def _as_float(value: Any) -> float:
    return math.nan if value is None else float(value)


class SQLiteManager:
    """The SQLite side of the records: one file, one ``records`` table.

    Args:
        path: the database file; its folder is created if needed.

    Example:
        >>> import tempfile, os
        >>> db = SQLiteManager(os.path.join(tempfile.mkdtemp(), "records.db"))
        >>> db.write([Record("accuracies_val", "p@1'; DROP TABLE records;--", 1, 0.5, 0.0)])
        >>> db.history("accuracies_val")
        ([1], {"p@1'; DROP TABLE records;--": [0.5]})
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection | None = _open(self.path)
        self._finalizer = weakref.finalize(self, self._conn.close)

    def close(self) -> None:
        """Close the connection; a later call reopens it."""
        self._finalizer()
        self._conn = None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection, committing on success and rolling back on error."""
        if self._conn is None:
            self._conn = _open(self.path)
            self._finalizer = weakref.finalize(self, self._conn.close)
        with self._conn:
            yield self._conn

    def __repr__(self) -> str:
        return f"SQLiteManager({str(self.path)!r})"

    def write(self, records: Sequence[Record]) -> None:
        """Insert or replace records in one transaction."""
        with self._transaction() as conn:
            conn.executemany(_UPSERT, [tuple(r) for r in records])

    def query(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[dict[str, Any]]:
        """Run a parameterised statement and return its rows as dicts.

        Example:
            >>> import tempfile, os
            >>> db = SQLiteManager(os.path.join(tempfile.mkdtemp(), "r.db"))
            >>> db.query("SELECT count(*) AS n FROM records WHERE name = ?", ("loss",))
            [{'n': 0}]
        """
        with self._transaction() as conn:
            cursor = conn.execute(sql, params)
            columns = [c[0] for c in cursor.description or ()]
            return [dict(zip(columns, row)) for row in cursor.fetchall()]

    def table_exists(self, table: str) -> bool:
        """Whether the database has a table called ``table``."""
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return bool(self.query(sql, (table,)))

    def groups(self) -> list[str]:
        """The record groups present, sorted."""
        rows = self.query("SELECT DISTINCT record_group FROM records ORDER BY record_group")
        return [r["record_group"] for r in rows]

    def names(self, group: str) -> list[str]:
        """The names recorded in ``group``, in the order they were first written."""
        sql = "SELECT name FROM records WHERE record_group = ? GROUP BY name ORDER BY min(rowid)"
        return [r["name"] for r in self.query(sql, (group,))]

    def history(
        self, group: str, names: Sequence[str] | None = None
    ) -> tuple[list[int], dict[str, list[float]]]:
        """The steps of ``group`` in ascending order, and each name's values at those steps.

        A name not recorded at some step has ``nan`` there (NaN values also read back as
        ``nan``). An unknown group gives ``([], {})``.
        """
        names = self.names(group) if names is None else list(names)
        rows = self.query(
            "SELECT step, name, value FROM records WHERE record_group = ? ORDER BY step",
            (group,),
        )
        steps = sorted({r["step"] for r in rows})
        position = {s: i for i, s in enumerate(steps)}
        values = {n: [math.nan] * len(steps) for n in names}
        for r in rows:
            if r["name"] in values:
                values[r["name"]][position[r["step"]]] = _as_float(r["value"])
        return steps, values

    def delete_after(self, group: str, step: int) -> None:
        """Remove the records of ``group`` whose step is greater than ``step``."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM records WHERE record_group = ? AND step > ?", (group, step))


def make_tensorboard_writer(folder: PathLike) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` logging to ``folder``.

    Raises:
        BackendNotInstalledError: the ``tensorboard`` package is not installed.

    Example:
        >>> import tempfile
        >>> writer = make_tensorboard_writer(tempfile.mkdtemp())  # doctest: +SKIP
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        raise BackendNotInstalledError(
            "TensorBoard logging needs the 'tensorboard' package: "
            'pip install "pytorch-metric-learning[tensorboard]", or pass '
            "tensorboard_folder=None to log to CSV and SQLite only."
        ) from error
    return SummaryWriter(log_dir=os.fspath(folder))


def _to_value(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        expected = "a mapping of names to real numbers"
        raise invalid(
            "records", "RecordKeeper.update_records", expected, {name: value}, InvalidTypeError
        )
    return float(value)


class RecordKeeper:
    """Buffer records and write them to CSV files, SQLite and TensorBoard.

    Args:
        csv_folder: where the per-metric CSV files go (created if needed).
        sqlite_manager: the database; default: ``<csv_folder>/records.db``.
        tensorboard_writer: a ``SummaryWriter`` (or anything with ``add_scalar`` and
            ``flush``), or None.

    Example:
        >>> import tempfile
        >>> keeper = RecordKeeper(tempfile.mkdtemp())
        >>> keeper.update_records({"total_loss": 0.7}, step=0, group="loss_histories")
        >>> keeper.update_records({"total_loss": 0.5}, step=1, group="loss_histories")
        >>> keeper.save_records()
        >>> keeper.history("loss_histories")
        ([0, 1], {'total_loss': [0.7, 0.5]})
    """

    def __init__(
        self,
        csv_folder: PathLike,
        sqlite_manager: SQLiteManager | None = None,
        tensorboard_writer: Any = None,
    ) -> None:
        self.csv_folder = Path(csv_folder)
        self.csv_folder.mkdir(parents=True, exist_ok=True)
        self.sqlite_manager = sqlite_manager or SQLiteManager(self.csv_folder / "records.db")
        self.tensorboard_writer = tensorboard_writer
        self._pending: list[Record] = []
        self._step_names: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"RecordKeeper({str(self.csv_folder)!r}, {self.sqlite_manager!r})"

    def close(self) -> None:
        """Write what is queued, then close the database and the TensorBoard writer.

        Call it when training is over; the TensorBoard writer's background thread keeps
        running until then.
        """
        self.save_records()
        if self.tensorboard_writer is not None and hasattr(self.tensorboard_writer, "close"):
            self.tensorboard_writer.close()
        self.sqlite_manager.close()

    def __enter__(self) -> RecordKeeper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def update_records(
        self, records: Mapping[str, Any], step: int, group: str, step_name: str = "step"
    ) -> None:
        """Queue ``records`` (name -> number) of ``group`` at ``step``; nothing is written yet.

        Args:
            records: names and values; a value may be a Python or NumPy number or a
                one-element tensor.
            step: the epoch or iteration the values belong to.
            group: the record group, e.g. ``"accuracies_val"``.
            step_name: the header of the step column in the CSV files.

        Raises:
            InvalidTypeError: a value is not a real number.
        """
        now = time.time()
        self._step_names.setdefault(group, step_name)
        for name, value in records.items():
            self._pending.append(Record(group, str(name), int(step), _to_value(name, value), now))

    def save_records(self) -> None:
        """Write the queued records (SQLite first, then CSV, then TensorBoard)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        self.sqlite_manager.write(pending)
        self._append_csv(pending)
        if self.tensorboard_writer is not None:
            for r in pending:
                self.tensorboard_writer.add_scalar(f"{r.group}/{r.name}", r.value, r.step)
            self.tensorboard_writer.flush()

    def history(
        self, group: str, names: Sequence[str] | None = None
    ) -> tuple[list[int], dict[str, list[float]]]:
        """Steps and values of ``group`` (see :meth:`SQLiteManager.history`), after saving
        what is queued."""
        self.save_records()
        return self.sqlite_manager.history(group, names)

    def groups(self) -> list[str]:
        """The record groups saved so far, sorted."""
        self.save_records()
        return self.sqlite_manager.groups()

    def names(self, group: str) -> list[str]:
        """The names recorded in ``group``."""
        self.save_records()
        return self.sqlite_manager.names(group)

    def delete_after(self, group: str, step: int) -> None:
        """Forget the records of ``group`` after ``step``, in SQLite and the CSV files.

        Used when training resumes from a checkpoint older than the last records.
        """
        self.save_records()
        self.sqlite_manager.delete_after(group, step)
        folder = self.csv_folder / safe_file_name(group)
        if folder.is_dir():
            for path in folder.glob("*.csv"):
                _truncate_csv(path, step)

    def csv_path(self, group: str, name: str) -> Path:
        """The CSV file of one metric."""
        return self.csv_folder / safe_file_name(group) / f"{safe_file_name(name)}.csv"

    def _append_csv(self, records: Sequence[Record]) -> None:
        by_file: dict[tuple[str, str], list[Record]] = defaultdict(list)
        for r in records:
            by_file[(r.group, r.name)].append(r)
        for (group, name), rows in by_file.items():
            path = self.csv_path(group, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            if not path.exists() or path.stat().st_size == 0:
                writer.writerow([self._step_names.get(group, "step"), name])
            writer.writerows([r.step, repr(r.value)] for r in rows)
            with open(path, "a", encoding="utf-8", newline="") as handle:
                handle.write(buffer.getvalue())  # one write per file and flush


def _truncate_csv(path: Path, step: int) -> None:
    """Rewrite a metric's CSV file without the rows after ``step`` (atomically)."""
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) <= step]
    if len(kept) == len(rows):
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows(kept)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
