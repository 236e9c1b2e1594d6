"""The SQLite layer under the records: the schema, opening a database, and turning a
failure of the database *file* (damaged, full, unwritable) into the library's errors
naming it. SQL mistakes are not translated: they are bugs, not bad files."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import stat
from pathlib import Path

from .._atomic import kind_of_mode, write_error
from ..errors import CorruptFileError, FileWriteError

__all__ = [
    "SCHEMA",
    "damaged_schema",
    "SET_ASIDE",
    "UPSERT",
    "COLUMNS",
    "open_database",
    "is_file_failure",
    "sqlite_error",
    "file_identity",
    "check_same_file",
    "schema_error",
    "refuse_unsafe_database_files",
    "check_tables",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    record_group TEXT NOT NULL,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    value REAL,
    wall_time REAL NOT NULL,
    PRIMARY KEY (record_group, name, step)
)
"""
MORE_TABLES = (
    """CREATE TABLE IF NOT EXISTS superseded_records (
        record_group TEXT NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL,
        value REAL, wall_time REAL NOT NULL, superseded_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS record_groups (
        record_group TEXT PRIMARY KEY, step_name TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS csv_pending (
        record_group TEXT NOT NULL, name TEXT NOT NULL, PRIMARY KEY (record_group, name))""",
    """CREATE TABLE IF NOT EXISTS csv_files (
        record_group TEXT NOT NULL, name TEXT NOT NULL, file TEXT NOT NULL UNIQUE COLLATE NOCASE,
        PRIMARY KEY (record_group, name))""",
)
# The columns each table must have, in order: anything else is a damaged schema.
COLUMNS = {
    "records": ("record_group", "name", "step", "value", "wall_time"),
    "superseded_records": (
        "record_group",
        "name",
        "step",
        "value",
        "wall_time",
        "superseded_at",
    ),
    "record_groups": ("record_group", "step_name"),
    "csv_pending": ("record_group", "name"),
    "csv_files": ("record_group", "name", "file"),
}
SET_ASIDE = (
    "INSERT INTO superseded_records SELECT record_group, name, step, value, wall_time, ? "
    "FROM records WHERE record_group = ? AND name = ? AND step = ?"
)
UPSERT = (
    "INSERT INTO records (record_group, name, step, value, wall_time) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (record_group, name, step) DO UPDATE "
    "SET value = excluded.value, wall_time = excluded.wall_time"
)


def open_database(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode: a commit is atomic and survives a crash of the process
    without an fsync per commit (a power cut may lose the last commits, never the file)."""
    refuse_unsafe_database_files(path)
    try:
        conn = sqlite3.connect(path, timeout=30)
    except sqlite3.Error as error:  # a folder of that name, a dangling link, ...
        raise sqlite_error(path, error) from error
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if tables & set(COLUMNS):  # an existing database: every table must be there
            _check_schema(path, conn, tables)
            check_tables(path, conn)
        for statement in (SCHEMA, *MORE_TABLES):
            conn.execute(statement)
        conn.commit()
        _check_schema(path, conn)
    except sqlite3.Error as error:
        conn.close()
        raise sqlite_error(path, error) from error
    except CorruptFileError:
        conn.close()
        raise
    return conn


_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def refuse_unsafe_database_files(path: Path) -> None:
    """Raise FileWriteError unless ``path`` and its side files (``-wal``, ``-shm``,
    ``-journal``) are each a regular file or missing, seen without following links.

    SQLite opens all of them through links and creates the side files beside a link's
    target: a ``records.db`` linking to another database would get our tables, one
    linking to ``/dev/null`` would make SQLite create ``/dev/null-journal``.
    """
    for suffix in _SIDE_FILES:
        side = path.with_name(path.name + suffix)
        try:
            mode = os.lstat(side).st_mode
        except FileNotFoundError:
            continue
        except OSError as error:
            raise write_error(side, error, "records database") from error
        if stat.S_ISREG(mode):
            continue
        found = kind_of_mode(mode)
        refused = FileWriteError(
            f"Refusing to open the records database {str(path)!r}: {str(side)!r} is {found}, "
            "not a regular file; it was left as it is. Move it aside (or pass another folder)."
        )
        refused.errno = errno.EEXIST
        raise refused


def check_tables(path: Path, conn: sqlite3.Connection) -> None:
    """Raise CorruptFileError naming the first table of ours that is missing (dropped by
    something else): recreating it empty would silently lose what it held."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    for table in COLUMNS:
        if table not in tables:
            raise schema_error(path, table, "is missing (dropped)")


def _check_schema(path: Path, conn: sqlite3.Connection, present: set[str] | None = None) -> None:
    """Raise CorruptFileError naming the first table (of ``present``, default all) whose
    columns are not the expected."""
    for table, expected in COLUMNS.items():
        if present is not None and table not in present:
            continue
        got = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
        if got != expected:
            raise schema_error(path, table, f"its columns are {list(got)}, not {list(expected)}")


def schema_error(path: Path, table: str, problem: str) -> CorruptFileError:
    """The error for a records database whose table ``table`` is missing or altered."""
    return CorruptFileError(
        f"The records database {str(path)!r} has a damaged schema: the table {table!r} "
        f"{problem}. The file was changed by something other than this library; move it "
        "aside (or pass another folder) to keep new records."
    )


_MISSING_TABLE = re.compile(r"no such table: (?:main\.)?(\w+)")
_MISSING_COLUMN = re.compile(r"table (\w+) has no column named (\w+)")


def damaged_schema(path: Path, error: sqlite3.Error) -> CorruptFileError | None:
    """CorruptFileError for an error that says a table or a column of ours is gone."""
    text = str(error)
    found = _MISSING_TABLE.search(text)
    if found and found[1] in COLUMNS:
        return schema_error(path, found[1], "is missing (dropped while in use)")
    found = _MISSING_COLUMN.search(text)
    if found and found[1] in COLUMNS:
        return schema_error(path, found[1], f"has no column {found[2]!r}")
    if "no such column" in text:
        return schema_error(path, "records", f"lost a column ({text})")
    return None


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``; None when it is missing."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def check_same_file(path: Path, identity: tuple[int, int] | None) -> None:
    """Raise FileWriteError when ``path`` is no longer the file the connection opened
    (deleted, moved or replaced while in use): writes would go to an unlinked file and be
    lost when the process ends."""
    refuse_unsafe_database_files(path)
    now = file_identity(path)
    if identity is not None and now == identity:
        return
    state = "was deleted or moved" if now is None else "was replaced by another file"
    error = FileWriteError(
        f"Could not write the records database {str(path)!r}: it {state} while in use, so "
        "records written now would be lost. The queued records are kept; put the file back "
        "or start a new RecordKeeper."
    )
    error.errno = errno.ESTALE
    raise error


# SQLite result codes (the low byte of sqlite_errorcode) that mean the file, not the SQL.
_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_FILE_CODES = {5, 6, 8, 10, 13, 14, *_CORRUPT_CODES}  # BUSY, LOCKED, READONLY, IOERR, FULL, ...
_NEARLY_FULL = 1 << 20  # bytes
_FILE_MESSAGES = ("not a database", "malformed", "disk is full", "disk i/o", "readonly")


def is_file_failure(error: sqlite3.Error) -> bool:
    """Whether a SQLite error is about the database file (full, damaged, unwritable)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _FILE_CODES
    return any(text in str(error).lower() for text in _FILE_MESSAGES)


def sqlite_error(path: Path, error: sqlite3.Error) -> Exception:
    """The library's error for a failure of the database file, naming it."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    text = str(error).lower()
    if code in _CORRUPT_CODES or "not a database" in text or "malformed" in text:
        return CorruptFileError(
            f"The records database {str(path)!r} cannot be read ({error}); it is damaged or "
            "not a SQLite file. Move it aside (or pass another folder) to keep new records."
        )
    full = code == 13 or "full" in text or (code == 10 and _nearly_full(path))
    if full and "full" not in text:
        error = sqlite3.OperationalError(f"{error}: the disk is full")
    wrapped = write_error(path, error, "records database")
    if full:
        wrapped.errno = errno.ENOSPC
    return wrapped


def _nearly_full(path: Path) -> bool:
    """Whether the disk of ``path`` is (nearly) full: in WAL mode SQLite reports a full
    disk as a generic I/O error when it cannot grow its shared-memory file."""
    try:
        return shutil.disk_usage(path.parent).free < _NEARLY_FULL
    except OSError:
        return False
