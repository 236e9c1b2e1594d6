"""Keep training records (losses, accuracies) in CSV files, SQLite and, optionally, TensorBoard.

A record is one number: its *group* (``"accuracies_val"``, ``"loss_histories"``), its *name*
(``"precision_at_1_level0"``), the *step* it belongs to (an epoch or an iteration) and its
value. :class:`RecordKeeper` buffers records and writes them on :meth:`RecordKeeper.save_records`:

* to one SQLite database, the source of truth: the table ``records(record_group, name,
  step, value, wall_time)``. Group and metric names are bound as statement parameters,
  never pasted into SQL, so any characters are safe. Writing a (group, name, step) a
  second time replaces the value (a resumed run that repeats an epoch does not duplicate
  it); the replaced row, like every row set aside when training resumes from an earlier
  epoch, moves to the table ``superseded_records`` (same columns plus ``superseded_at``);
* to one CSV file per metric, ``<csv_folder>/<group>/<name>.csv`` with the header
  ``<step name>,<metric name>``, derived from SQLite (see ``_record_csv``); a name that is
  not a plain file name is rewritten to a safe one with a short hash of the original,
  which stays readable in the header;
* to TensorBoard, as scalars tagged ``<group>/<name>``, when a writer is given.

A save is all-or-nothing: the queued rows enter SQLite in one transaction or stay queued
for the next save, and CSV files left behind by a failed or killed save are completed
from SQLite by the next save.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import numbers
import os
import re
import sqlite3
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Union

import torch

from .._atomic import make_folder, refuse_linked_folders
from .._folder_lock import FolderLock, lock_folder
from .._validation import invalid
from ..errors import (
    BackendNotInstalledError,
    FileWriteError,
    FolderInUseError,
    InvalidArgumentError,
    InvalidStepError,
    InvalidTypeError,
)
from ._record_csv import append_rows, remove_csv_leftovers, rewrite_file, tail_agrees
from ._records_db import (
    SET_ASIDE,
    UPSERT,
    check_same_file,
    check_tables,
    damaged_schema,
    file_identity,
    is_file_failure,
    open_database,
    sqlite_error,
)
from .checkpoints import set_aside

__all__ = ["Record", "SQLiteManager", "RecordKeeper", "make_tensorboard_writer", "safe_file_name"]

PathLike = Union[str, "os.PathLike[str]"]
logger = logging.getLogger(__name__)

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


def _as_float(value: Any) -> float:
    return math.nan if value is None else float(value)


class SQLiteManager:
    """The SQLite side of the records: one file, one ``records`` table.

    Args:
        path: the database file; its folder is created if needed.

    Raises:
        CorruptFileError: ``path`` exists but is not a readable SQLite database.
        FileWriteError: the folder of ``path`` cannot be created (a file has its name).

    Example:
        >>> import tempfile, os
        >>> db = SQLiteManager(os.path.join(tempfile.mkdtemp(), "records.db"))
        >>> db.write([Record("accuracies_val", "p@1'; DROP TABLE records;--", 1, 0.5, 0.0)])
        >>> db.history("accuracies_val")
        ([1], {"p@1'; DROP TABLE records;--": [0.5]})
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        make_folder(self.path.parent, "folder of the records database")
        self._conn: sqlite3.Connection | None = open_database(self.path)
        self._identity = file_identity(self.path)
        self._finalizer = weakref.finalize(self, self._conn.close)

    def close(self) -> None:
        """Close the connection; a later call reopens it."""
        self._finalizer()
        self._conn = None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection, committing on success and rolling back on error; a failure of
        the database file itself is raised as the library's error naming the file."""
        if self._conn is None:
            self._conn = open_database(self.path)
            self._identity = file_identity(self.path)
            self._finalizer = weakref.finalize(self, self._conn.close)
        check_same_file(self.path, self._identity)
        conn = self._conn
        try:
            check_tables(self.path, conn)
            yield conn
            self._commit(conn)
        except BaseException as error:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
            if isinstance(error, sqlite3.Error) and is_file_failure(error):
                raise sqlite_error(self.path, error) from error
            damaged = damaged_schema(self.path, error) if isinstance(error, sqlite3.Error) else None
            if damaged is not None:
                raise damaged from error
            raise

    @staticmethod
    def _commit(conn: sqlite3.Connection) -> None:
        conn.commit()

    def __repr__(self) -> str:
        return f"SQLiteManager({str(self.path)!r})"

    def write(self, records: Sequence[Record], step_names: Mapping[str, str] | None = None) -> None:
        """Insert or replace records in one transaction (a replaced row is kept in
        ``superseded_records``); ``step_names`` gives each new group's CSV step header."""
        self.write_rows(records, step_names)

    def write_rows(
        self, records: Sequence[Record], step_names: Mapping[str, str] | None = None
    ) -> set[tuple[str, str]]:
        """:meth:`write`, returning the (group, name) pairs whose CSV file must be rebuilt
        rather than appended to. Every pair written is marked in ``csv_pending`` until
        :meth:`csv_done` clears it."""
        records = list({(r.group, r.name, r.step): r for r in records}.values())
        now = time.time()
        with self._transaction() as conn:
            rebuild = _pairs_to_rebuild(conn, records)
            replaced = [
                (now, r.group, r.name, r.step) for r in records if (r.group, r.name) in rebuild
            ]
            conn.executemany(SET_ASIDE, replaced)
            conn.executemany(UPSERT, [tuple(r) for r in records])
            pairs = sorted({(r.group, r.name) for r in records})
            conn.executemany("INSERT OR IGNORE INTO csv_pending VALUES (?, ?)", pairs)
            groups = sorted({(g, (step_names or {}).get(g, "step")) for g, _ in pairs})
            conn.executemany("INSERT OR IGNORE INTO record_groups VALUES (?, ?)", groups)
        return rebuild

    def csv_pending(self) -> list[tuple[str, str]]:
        """The (group, name) pairs whose CSV file may lag behind the database."""
        rows = self.query("SELECT record_group, name FROM csv_pending ORDER BY rowid")
        return [(r["record_group"], r["name"]) for r in rows]

    def csv_done(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Clear the ``csv_pending`` marks of files that now hold every row."""
        with self._transaction() as conn:
            conn.executemany(
                "DELETE FROM csv_pending WHERE record_group = ? AND name = ?", list(pairs)
            )

    def csv_file(self, group: str, name: str) -> str:
        """The CSV file of one metric, relative to the CSV folder: chosen once and kept in
        the table ``csv_files``, so two names never share a file (file names are compared
        case-insensitively, as some file systems do)."""
        sql = "SELECT file FROM csv_files WHERE record_group = ? AND name = ?"
        rows = self.query(sql, (group, name))
        if rows:
            return str(rows[0]["file"])
        stem = f"{safe_file_name(group)}/{safe_file_name(name)}"
        with self._transaction() as conn:
            for attempt in range(1, 10**6):
                file = f"{stem}.csv" if attempt == 1 else f"{stem}-{attempt}.csv"
                taken = conn.execute("SELECT 1 FROM csv_files WHERE file = ?", (file,)).fetchone()
                if not taken:
                    conn.execute("INSERT INTO csv_files VALUES (?, ?, ?)", (group, name, file))
                    return file
        raise AssertionError("unreachable")  # pragma: no cover

    def last_step_before(self, group: str, name: str, step: int) -> int | None:
        """The latest stored step of one metric before ``step`` (None if there is none)."""
        sql = "SELECT max(step) AS s FROM records WHERE record_group = ? AND name = ? AND step < ?"
        found = self.query(sql, (group, name, step))[0]["s"]
        return None if found is None else int(found)

    def step_name(self, group: str) -> str:
        """The header of the step column of ``group``'s CSV files."""
        sql = "SELECT step_name FROM record_groups WHERE record_group = ?"
        rows = self.query(sql, (group,))
        return str(rows[0]["step_name"]) if rows else "step"

    def rows(self, group: str, name: str) -> list[tuple[int, float]]:
        """``(step, value)`` of one metric, by step."""
        sql = "SELECT step, value FROM records WHERE record_group = ? AND name = ? ORDER BY step"
        return [(r["step"], _as_float(r["value"])) for r in self.query(sql, (group, name))]

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

    def set_aside_after(self, group: str, step: int | None) -> int:
        """Move the records of ``group`` whose step is greater than ``step`` (all of them
        with ``step=None``) to ``superseded_records``, and mark their CSV files; return
        how many rows moved."""
        where = "record_group = ?" + ("" if step is None else " AND step > ?")
        params = (group,) if step is None else (group, step)
        with self._transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO csv_pending SELECT DISTINCT record_group, name "
                f"FROM records WHERE {where}",
                params,
            )
            conn.execute(
                "INSERT INTO superseded_records SELECT record_group, name, step, value, "
                f"wall_time, ? FROM records WHERE {where}",
                (time.time(), *params),
            )
            return int(conn.execute(f"DELETE FROM records WHERE {where}", params).rowcount)


def _pairs_to_rebuild(conn: sqlite3.Connection, records: Sequence[Record]) -> set[tuple[str, str]]:
    """Pairs whose new rows are not all later than every stored row (appending would
    duplicate a step or break the order)."""
    first: dict[tuple[str, str], int] = {}
    for r in records:
        first[(r.group, r.name)] = min(r.step, first.get((r.group, r.name), r.step))
    sql = "SELECT max(step) FROM records WHERE record_group = ? AND name = ?"
    rebuild = set()
    for pair, step in first.items():
        (latest,) = conn.execute(sql, pair).fetchone()
        if latest is not None and step <= latest:
            rebuild.add(pair)
    return rebuild


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
        from ..evaluation.search._install_hint import extra_install_hint

        raise BackendNotInstalledError(
            "TensorBoard logging needs the 'tensorboard' package: "
            f"{extra_install_hint('tensorboard')}, or pass "
            "tensorboard_folder=None to log to CSV and SQLite only."
        ) from error
    return SummaryWriter(log_dir=os.fspath(folder))


_OWNER = "RecordKeeper.update_records"


def _to_value(name: Any, value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        expected = "a mapping of names to real numbers"
        raise invalid("records", _OWNER, expected, {name: value}, InvalidTypeError)
    try:
        result = float(value)
        if math.isinf(result) and value != result:  # np.longdouble("1e4000") -> inf
            raise OverflowError("the value became infinite when converted to a float")
    except OverflowError as error:
        raise InvalidArgumentError(
            f"{_OWNER} cannot store the record {str(name)!r}: its value does not fit a "
            "float (SQLite stores 64-bit floats). Nothing was queued."
        ) from error
    return result


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
        make_folder(self.csv_folder, "CSV folder")
        self.sqlite_manager = sqlite_manager or SQLiteManager(self.csv_folder / "records.db")
        self.tensorboard_writer = tensorboard_writer
        self._pending: list[Record] = []
        self._step_names: dict[str, str] = {}
        self._csv_files: dict[tuple[str, str], Path] = {}
        self._locks: dict[str, FolderLock] = {}
        self._finalizer = weakref.finalize(self, _release_all, self._locks)
        # CSV files that an earlier save (maybe of a killed process) left behind SQLite.
        self._stale = set(self.sqlite_manager.csv_pending())
        if self._stale:
            try:
                self._sync_csv([], set())
            except FolderInUseError:
                pass  # the run that owns the folder completes them
            except FileWriteError as error:
                logger.warning("CSV files lag behind %s until the next save: %s", self, error)

    def __repr__(self) -> str:
        return f"RecordKeeper({str(self.csv_folder)!r}, {self.sqlite_manager!r})"

    def close(self) -> None:
        """Write what is queued, then close the database and the TensorBoard writer and
        give up the folder locks (see :meth:`lock_folder`).

        Call it when training is over; the TensorBoard writer's background thread keeps
        running until then. If the last save fails, everything is closed all the same and
        the save's error is raised.
        """
        try:
            self.save_records()
        finally:
            if self.tensorboard_writer is not None and hasattr(self.tensorboard_writer, "close"):
                self.tensorboard_writer.close()
            self.sqlite_manager.close()
            self._finalizer()

    def lock_folder(self, folder: PathLike | None = None, what: str = "model folder") -> None:
        """Own ``folder`` (default: the CSV folder) for this run: an advisory lock that
        this keeper holds until :meth:`close` (see ``_folder_lock``).

        The keeper takes the lock of its CSV folder before its first write; the hook
        container takes those of the model folder and the record folder at resume,
        ``start_fresh`` and the first save.

        Raises:
            FolderInUseError: another live process holds ``folder`` (the message names it
                and that process's PID).
        """
        if folder is None:
            folder, what = self.csv_folder, "record folder"
        key = os.path.realpath(folder)
        if key not in self._locks:
            self._locks[key] = lock_folder(folder, what)

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
            step: the epoch or iteration the values belong to (an int).
            group: the record group, e.g. ``"accuracies_val"``.
            step_name: the header of the step column in the CSV files.

        Raises:
            InvalidTypeError: a value is not a real number (then nothing of ``records``
                is queued).
            InvalidStepError: ``step`` is not an int (also a ``ValueError``).
            InvalidArgumentError: SQLite cannot store a record: a name with a lone
                surrogate (not UTF-8), a step outside the 64-bit range, a value too large
                for a float (``10**400``). The message names the record; nothing is queued.
        """
        step = _check_step(step)
        for param, text in (("group", group), ("step_name", step_name)):
            if not isinstance(text, str):
                raise invalid(param, _OWNER, "a str", text, InvalidTypeError)
            _check_storable_text(param, text, f"the {param} {text!r}")
        if not _INT64[0] <= step <= _INT64[1]:
            raise invalid(
                "step",
                _OWNER,
                "an int SQLite can store (-2**63 to 2**63-1)",
                step,
                InvalidStepError,
            )
        now = time.time()
        # Every value is checked before any is queued: a bad one queues nothing.
        queued = [Record(group, str(k), step, _to_value(k, v), now) for k, v in records.items()]
        for record in queued:
            _check_storable_text("records", record.name, f"the record {record.name!r}")
        self._step_names.setdefault(group, step_name)
        self._pending.extend(queued)

    def save_records(self) -> None:
        """Write the queued records: SQLite in one transaction, then the CSV files, then
        TensorBoard.

        If SQLite fails (disk full, say) nothing is written and the queue is kept for the
        next call. If a CSV file fails, the records are already safe in SQLite and the
        next call completes the file.

        Raises:
            FileWriteError: the database or a CSV file could not be written (an
                ``OSError`` naming the file).
            CorruptFileError: the database file is damaged.
        """
        if self._pending or self._stale:
            self.lock_folder()
        pending, self._pending = self._pending, []
        try:
            rebuild = (
                self.sqlite_manager.write_rows(pending, self._step_names) if pending else set()
            )
        except BaseException:
            self._pending = pending + self._pending
            raise
        try:
            self._sync_csv(pending, rebuild)
        finally:  # in SQLite now: TensorBoard gets them even if a CSV file failed
            self._to_tensorboard(pending)

    def _to_tensorboard(self, records: Sequence[Record]) -> None:
        if self.tensorboard_writer is not None and records:
            for r in records:
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

    def set_aside_after(self, group: str, step: int | None) -> bool:
        """Move the records of ``group`` after ``step`` (all of them with ``step=None``) to
        the table ``superseded_records``, and rewrite the CSV files without them; return
        whether any row moved.

        Used when training resumes from a checkpoint older than the last records: the
        superseded rows stay recoverable. TensorBoard's event files cannot drop values:
        call :meth:`set_aside_tensorboard` after the rows moved.
        """
        self.save_records()
        self.lock_folder()
        moved = self.sqlite_manager.set_aside_after(group, step)
        self._sync_csv([], set())
        return moved > 0

    def set_aside_tensorboard(self) -> Path | None:
        """Move every TensorBoard event file (of earlier runs and, closed first, the
        writer's own) aside, to ``<log dir>/superseded/<UTC time>/``, open a new event
        file, and write the records SQLite keeps into the
        current event file: TensorBoard then shows each step once, with the kept value.
        Returns the folder the files went to (None without a writer or old files)."""
        log_dir, _own = _event_files_of(self.tensorboard_writer)
        if log_dir is None:
            return None
        # This writer's own file holds the set-aside steps too (start_fresh in the same
        # process): close it, move it aside with the others, and open a new one.
        self.tensorboard_writer.close()
        old = sorted(log_dir.glob("events.out.tfevents.*"))
        moved_to = set_aside(old, log_dir) if old else None
        self.tensorboard_writer._get_file_writer()  # a new event file
        db = self.sqlite_manager
        for group in db.groups():
            for name in db.names(group):
                for step, value in db.rows(group, name):
                    self.tensorboard_writer.add_scalar(f"{group}/{name}", value, step)
        self.tensorboard_writer.flush()
        return moved_to

    def csv_path(self, group: str, name: str) -> Path:
        """The CSV file of one metric: ``<group>/<name>.csv`` made safe (see
        :func:`safe_file_name`), chosen once per database so that no two metrics share a
        file (see :meth:`SQLiteManager.csv_file`)."""
        pair = (group, name)
        if pair not in self._csv_files:
            self._csv_files[pair] = self.csv_folder / self.sqlite_manager.csv_file(group, name)
        return self._csv_files[pair]

    def _sync_csv(self, written: Sequence[Record], rebuild: set[tuple[str, str]]) -> None:
        """Bring every marked CSV file in line with SQLite: append the new rows where that
        is exact, rebuild the others; then clear their marks."""
        by_pair: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        for r in written:
            by_pair[(r.group, r.name)].append((r.step, r.value))
        pending, done = self.sqlite_manager.csv_pending(), []
        if pending:
            self.lock_folder()
        try:
            for pair in pending:
                exact = pair not in rebuild and pair not in self._stale
                self._write_csv(pair, by_pair.get(pair) if exact else None)
                done.append(pair)
        except BaseException:
            self._stale.update(pending[len(done) :])
            raise
        finally:
            if done:
                self.sqlite_manager.csv_done(done)
                self._stale.difference_update(done)
                remove_csv_leftovers(self.csv_path(*pair).parent for pair in done)

    def _write_csv(self, pair: tuple[str, str], new_rows: list[tuple[int, float]] | None) -> None:
        """Append ``new_rows`` when that is exact: the file is a regular file (not a link)
        whose last row is the step SQLite held last before them, on a full line.
        Otherwise (a missing file, a file cut mid-line or edited, a link) write the whole
        file from SQLite."""
        group, name = pair
        path, header = self.csv_path(group, name), [self.sqlite_manager.step_name(group), name]
        refuse_linked_folders(self.csv_folder, path, "CSV file")
        if new_rows:
            rows = sorted(dict(new_rows).items())
            before = self.sqlite_manager.last_step_before(group, name, rows[0][0])
            if tail_agrees(path, header, before):
                append_rows(path, rows)
                return
        rewrite_file(path, header, self.sqlite_manager.rows(group, name))


_INT64 = (-(2**63), 2**63 - 1)


def _check_storable_text(param: str, text: str, label: str) -> None:
    """SQLite stores text as UTF-8: a lone surrogate cannot be stored."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgumentError(
            f"{_OWNER} cannot store {label} (argument {param!r}): it is not valid Unicode "
            f"text ({error.reason} at position {error.start}), so SQLite cannot store it. "
            "Nothing was queued."
        ) from error


def _event_files_of(writer: Any) -> tuple[Path | None, str | None]:
    """The log folder of a ``SummaryWriter`` and the name of its own event file."""
    get_file_writer = getattr(writer, "_get_file_writer", None)
    if not callable(get_file_writer):
        return None, None
    file_writer = get_file_writer()
    log_dir = getattr(file_writer, "get_logdir", lambda: None)()
    own = getattr(getattr(file_writer, "event_writer", None), "_file_name", None)
    if log_dir is None or own is None:
        return None, None
    return Path(log_dir), os.path.basename(own)


def _release_all(locks: dict[str, FolderLock]) -> None:
    for lock in locks.values():
        lock.release()
    locks.clear()


def _check_step(step: Any) -> int:
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        step = step.item()
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise invalid("step", _OWNER, "an int (an epoch or an iteration)", step, InvalidStepError)
    return int(step)
