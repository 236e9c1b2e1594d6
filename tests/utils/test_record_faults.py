"""Records survive failed writes (a real SQLITE_FULL, failing CSV writes) and bad input
gets the library's errors naming the argument or the file."""

from __future__ import annotations

import csv
import errno
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning.errors import (
    CorruptFileError,
    FileWriteError,
    InvalidArgumentError,
    InvalidTypeError,
)
from pytorch_metric_learning.utils import _record_csv
from pytorch_metric_learning.utils._records_db import COLUMNS
from pytorch_metric_learning.utils.record_keeping import RecordKeeper, SQLiteManager


def sqlite_rows(path: Path) -> list[tuple[str, str, int, float]]:
    with sqlite3.connect(path) as conn:
        sql = "SELECT record_group, name, step, value FROM records ORDER BY 1, 2, 3"
        return conn.execute(sql).fetchall()


def csv_rows(folder: Path) -> list[tuple[str, str, int, float]]:
    rows = []
    for path in sorted(folder.rglob("*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            header, *body = list(csv.reader(handle))
        rows += [(path.parent.name, header[1], int(s), float(v)) for s, v in body]
    return sorted(rows)


def fill(keeper: RecordKeeper, steps: range) -> None:
    for step in steps:
        keeper.update_records({"loss": step / 2, "acc": step / 10}, step, "g")


def saved_keeper(folder: Path, steps: range) -> RecordKeeper:
    """A keeper of ``folder`` that has saved the records of ``steps`` (see :func:`fill`)."""
    keeper = RecordKeeper(folder)
    fill(keeper, steps)
    keeper.save_records()
    return keeper


def test_defect3_queue_survives_a_full_database(tmp_path: Path) -> None:
    keeper = saved_keeper(tmp_path, range(3))
    (pages,) = keeper.sqlite_manager.query("PRAGMA page_count")[0].values()
    keeper.sqlite_manager.query(f"PRAGMA max_page_count = {pages}")  # the disk is now full
    fill(keeper, range(3, 400))
    with pytest.raises(FileWriteError, match="records.db") as caught:
        keeper.save_records()
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)
    assert len(sqlite_rows(tmp_path / "records.db")) == 6  # nothing half-written
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")
    keeper.sqlite_manager.query("PRAGMA max_page_count = 1000000")  # space is freed
    keeper.save_records()
    expected = sorted(
        [("g", "acc", s, s / 10) for s in range(400)]
        + [("g", "loss", s, s / 2) for s in range(400)]
    )
    assert sqlite_rows(tmp_path / "records.db") == expected
    assert csv_rows(tmp_path) == expected


@pytest.mark.parametrize("failing", ["append", "replace"])
def test_defect3_csv_failure_is_completed_by_the_next_save(
    tmp_path: Path, monkeypatch, failing: str
) -> None:
    keeper = saved_keeper(tmp_path, range(3))
    fill(keeper, range(3, 6))
    keeper.update_records({"acc": 9.0}, 1, "g")  # a repeated step: the file is rebuilt

    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "append":
        monkeypatch.setattr(_record_csv, "append_bytes", broken)
    else:
        monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(FileWriteError, match=r"\.csv"):
        keeper.save_records()
    monkeypatch.undo()
    fill(keeper, range(6, 7))
    keeper.save_records()
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")
    assert [p for p in tmp_path.rglob("*.tmp")] == []
    assert ("g", "acc", 1, 9.0) in csv_rows(tmp_path)


def test_defect3_a_new_keeper_completes_csv_files_after_a_crash(
    tmp_path: Path, monkeypatch
) -> None:
    keeper = saved_keeper(tmp_path, range(2))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies after SQLite committed

    monkeypatch.setattr(_record_csv, "append_bytes", killed)
    fill(keeper, range(2, 5))
    with pytest.raises(KeyboardInterrupt):
        keeper.save_records()
    monkeypatch.undo()
    keeper.sqlite_manager.close()
    assert csv_rows(tmp_path) != sqlite_rows(tmp_path / "records.db")
    RecordKeeper(tmp_path).close()
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")
    assert len(csv_rows(tmp_path)) == 10


def test_repeated_steps_are_never_duplicated_and_old_values_are_kept(tmp_path: Path) -> None:
    keeper = saved_keeper(tmp_path, range(4))
    keeper.update_records({"loss": 7.0}, 2, "g")
    keeper.update_records({"loss": 8.0}, 2, "g")
    keeper.save_records()
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")
    assert ("g", "loss", 2, 8.0) in csv_rows(tmp_path)
    old = keeper.sqlite_manager.query("SELECT value FROM superseded_records WHERE step = 2")
    assert old == [{"value": 1.0}]


@pytest.mark.parametrize("step", ["abc", 2.7, 2.0, None, True, [1]])
def test_defect8_step_must_be_an_int(tmp_path: Path, step: object) -> None:
    keeper = RecordKeeper(tmp_path)
    with pytest.raises(InvalidTypeError, match="'step' parameter .* must be an int") as caught:
        keeper.update_records({"loss": 1.0}, step, "g")  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)  # what 2.x raised for "abc"
    keeper.save_records()
    assert sqlite_rows(tmp_path / "records.db") == []


def test_numpy_integer_steps_are_accepted(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"loss": 1.0}, np.int64(3), "g")
    keeper.save_records()
    assert sqlite_rows(tmp_path / "records.db") == [("g", "loss", 3, 1.0)]


@pytest.mark.parametrize(
    "content", [b"this is not a database" * 50, b"SQLite format 3\x00" + b"\xff" * 200]
)
def test_defect8_corrupt_database_error_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "records.db"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError, match="records.db"):
        SQLiteManager(path)
    assert path.read_bytes() == content


def test_a_csv_file_deleted_by_hand_comes_back_whole(tmp_path: Path) -> None:
    keeper = saved_keeper(tmp_path, range(3))
    keeper.csv_path("g", "acc").unlink()
    fill(keeper, range(3, 5))
    keeper.save_records()
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")
    assert len(csv_rows(tmp_path)) == 10


class ScalarLog:
    """Records what a TensorBoard ``SummaryWriter`` would be given."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass


def test_tensorboard_gets_the_records_even_when_a_csv_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = ScalarLog()
    keeper = RecordKeeper(tmp_path, tensorboard_writer=log)
    keeper.update_records({"loss": 0.5}, 1, "g")

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "simulated I/O error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", broken)  # the new CSV file cannot be put in place
        with pytest.raises(FileWriteError, match="loss.csv"):
            keeper.save_records()
    keeper.update_records({"loss": 0.25}, 2, "g")
    keeper.save_records()
    assert log.scalars == [("g/loss", 0.5, 1), ("g/loss", 0.25, 2)]  # each once
    assert csv_rows(tmp_path) == sqlite_rows(tmp_path / "records.db")


# ---------------------------------------------------------------- issue 30, part 4
UNSTORABLE = [
    pytest.param({"acc\udc80": 0.5}, 1, "g", id="lone-surrogate-in-a-name"),
    pytest.param({"acc": 0.5}, 1, "g\ud800", id="lone-surrogate-in-the-group"),
    pytest.param({"acc": 0.5}, 2**64 - 1, "g", id="step-2**64-1"),
    pytest.param({"acc": 0.5}, -(2**63) - 1, "g", id="step-below-int64"),
    pytest.param({"acc": 10**400}, 1, "g", id="value-10**400"),
    pytest.param({"acc": np.longdouble("1e4000")}, 1, "g", id="longdouble-1e4000-becomes-inf"),
]


@pytest.mark.parametrize(("records", "step", "group"), UNSTORABLE)
def test_an_unstorable_record_is_refused_at_once_naming_it(
    tmp_path: Path, records: dict, step: int, group: str
) -> None:
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"good": 1.0}, 0, "g")
    with pytest.raises(InvalidArgumentError) as caught:
        keeper.update_records(records, step, group)
    message = str(caught.value)
    assert "acc" in message or "step" in message or "group" in message
    keeper.update_records({"good": 2.0}, 1, "g")  # later saves are not blocked
    keeper.close()  # nor is close
    assert sqlite_rows(tmp_path / "records.db") == [("g", "good", 0, 1.0), ("g", "good", 1, 2.0)]


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_records_db_deleted_or_replaced_while_in_use_keeps_the_queue(
    tmp_path: Path, how: str
) -> None:
    keeper = saved_keeper(tmp_path, range(2))
    db = tmp_path / "records.db"
    for side in ("-wal", "-shm"):
        Path(f"{db}{side}").unlink(missing_ok=True)
    db.unlink()
    if how == "replaced":
        db.write_bytes(b"")
    fill(keeper, range(2, 4))
    with pytest.raises(FileWriteError, match="records.db") as caught:
        keeper.save_records()
    assert ("deleted" if how == "deleted" else "replaced") in str(caught.value)
    assert len(keeper._pending) == 4  # kept for a save that can succeed
    with pytest.raises(FileWriteError):
        keeper.close()


@pytest.mark.parametrize("table", ["records", "csv_pending", "record_groups", "csv_files"])
def test_a_dropped_table_is_a_corrupt_file_naming_file_and_table(
    tmp_path: Path, table: str
) -> None:
    keeper = saved_keeper(tmp_path, range(2))
    with sqlite3.connect(tmp_path / "records.db") as conn:
        conn.execute(f"DROP TABLE {table}")
    fill(keeper, range(2, 4))
    keeper.update_records({"new_metric": 1.0}, 4, "g")  # a new CSV file too
    with pytest.raises(CorruptFileError) as caught:
        keeper.save_records()
    message = str(caught.value)
    assert "records.db" in message and repr(table) in message


ALL_TABLES = sorted(COLUMNS)  # every table of the schema


@pytest.mark.parametrize("table", ALL_TABLES)
@pytest.mark.parametrize("then", ["save-known-metrics", "reopen"])
def test_every_dropped_table_is_noticed_never_recreated(
    tmp_path: Path, table: str, then: str
) -> None:
    """Every table of the schema, dropped by something else while the keeper is open: the
    next save of metrics already known (no new file name to look up), and the next
    keeper, raise CorruptFileError naming the table; the table is not recreated empty."""
    keeper = saved_keeper(tmp_path, range(2))
    with sqlite3.connect(tmp_path / "records.db") as conn:
        conn.execute(f"DROP TABLE {table}")
    with pytest.raises(CorruptFileError, match=repr(table)):
        if then == "reopen":
            keeper.sqlite_manager.close()
            RecordKeeper(tmp_path)
        else:
            fill(keeper, range(2, 4))
            keeper.save_records()
    with sqlite3.connect(tmp_path / "records.db") as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert table not in names


def test_an_altered_table_is_refused_when_opened(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "records.db") as conn:
        conn.execute("CREATE TABLE records (x INTEGER)")
    with pytest.raises(CorruptFileError, match="'records'"):
        RecordKeeper(tmp_path)
