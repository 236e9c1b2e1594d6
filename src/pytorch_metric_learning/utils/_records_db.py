"""The SQLite layer under the records: the schema, opening a database, and turning a
failure of the database *file* (damaged, full, unwritable) into the library's errors
naming it. SQL mistakes are not translated: they are bugs, not bad files."""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

from .._atomic import write_error
from ..errors import CorruptFileError

__all__ = ["SCHEMA", "SET_ASIDE", "UPSERT", "open_database", "is_file_failure", "sqlite_error"]

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
)
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
    try:
        conn = sqlite3.connect(path, timeout=30)
    except sqlite3.Error as error:  # a folder of that name, a dangling link, ...
        raise sqlite_error(path, error) from error
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for statement in (SCHEMA, *MORE_TABLES):
            conn.execute(statement)
        conn.commit()
    except sqlite3.Error as error:
        conn.close()
        raise sqlite_error(path, error) from error
    return conn


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
