"""RecordKeeper and SQLiteManager: CSV and SQLite contents, odd names, upserts, TensorBoard."""

from __future__ import annotations

import csv
import math
import re
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.errors import BackendNotInstalledError, InvalidTypeError
from pytorch_metric_learning.utils.logging_presets import get_record_keeper
from pytorch_metric_learning.utils.record_keeping import (
    RecordKeeper,
    SQLiteManager,
    safe_file_name,
)

ODD_NAMES = [
    "p@1'; DROP TABLE records; --",
    'quote"name',
    "../../escape",
    "/absolute/path",
    "名前 with spaces",
    "new\nline",
    "comma,semicolon;",
    "",
    "nul\x00char",
    ".",
    "..",
    "step",
    "x" * 300,
]


def raw_rows(db_path: Path) -> list[tuple[str, str, int, float | None]]:
    """Read the table with plain sqlite3, independently of SQLiteManager."""
    with sqlite3.connect(db_path) as conn:
        sql = "SELECT record_group, name, step, value FROM records ORDER BY rowid"
        return conn.execute(sql).fetchall()


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_records_are_written_only_on_save(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"loss": 1.5}, step=0, group="losses")
    assert raw_rows(tmp_path / "records.db") == []
    keeper.save_records()
    assert raw_rows(tmp_path / "records.db") == [("losses", "loss", 0, 1.5)]
    assert read_csv(tmp_path / "losses" / "loss.csv") == [["step", "loss"], ["0", "1.5"]]


def test_values_of_several_types(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    values = {"int": 3, "numpy": np.float32(0.25), "tensor": torch.tensor([0.5]), "inf": math.inf}
    keeper.update_records(values, step=2, group="g", step_name="epoch")
    keeper.save_records()
    assert raw_rows(tmp_path / "records.db") == [
        ("g", "int", 2, 3.0),
        ("g", "numpy", 2, 0.25),
        ("g", "tensor", 2, 0.5),
        ("g", "inf", 2, math.inf),
    ]
    assert read_csv(keeper.csv_path("g", "tensor")) == [["epoch", "tensor"], ["2", "0.5"]]


@pytest.mark.parametrize("bad", ["0.5", None, True, torch.ones(2), [0.5]])
def test_non_numbers_are_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidTypeError, match="'records' parameter"):
        RecordKeeper(tmp_path).update_records({"x": bad}, step=0, group="g")


def test_odd_names_are_safe_in_sqlite_and_csv(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    keeper = RecordKeeper(logs)
    for group in ["accuracies_val", *ODD_NAMES[:4]]:
        keeper.update_records({n: float(i) for i, n in enumerate(ODD_NAMES)}, step=1, group=group)
    keeper.save_records()
    rows = raw_rows(logs / "records.db")
    assert len(rows) == 5 * len(ODD_NAMES)
    assert {(g, n) for g, n, _, _ in rows} == {
        (g, n) for g in ["accuracies_val", *ODD_NAMES[:4]] for n in ODD_NAMES
    }
    steps, values = keeper.history("accuracies_val")
    assert steps == [1] and values == {n: [float(i)] for i, n in enumerate(ODD_NAMES)}
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(logs in p.parents for p in written)
    csv_files = [p for p in written if p.suffix == ".csv"]
    assert len(csv_files) == 5 * len(ODD_NAMES)  # no two names share a file
    for i, name in enumerate(ODD_NAMES):
        assert read_csv(keeper.csv_path("accuracies_val", name)) == [
            ["step", name],
            ["1", repr(float(i))],
        ]


@given(st.lists(st.text(min_size=0, max_size=30), min_size=1, max_size=6, unique=True))
def test_any_names_round_trip(names: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        keeper = RecordKeeper(folder)
        keeper.update_records({n: float(i) for i, n in enumerate(names)}, step=5, group="g")
        keeper.save_records()
        assert keeper.names("g") == names
        assert keeper.history("g") == ([5], {n: [float(i)] for i, n in enumerate(names)})
        keeper.sqlite_manager.close()


def test_safe_file_name() -> None:
    assert safe_file_name("precision_at_1_level0") == "precision_at_1_level0"
    odd = [safe_file_name(n) for n in ODD_NAMES]
    assert len(set(odd)) == len(ODD_NAMES)
    for name in odd:
        assert Path(name).name == name and name not in {".", ".."} and len(name) <= 100
        assert all(c.isalnum() or c in "_-" for c in name)


def test_writing_a_step_again_replaces_it(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"acc": 0.1}, step=1, group="g")
    keeper.update_records({"acc": 0.2}, step=2, group="g")
    keeper.save_records()
    keeper.update_records({"acc": 0.3}, step=2, group="g")
    keeper.save_records()
    assert keeper.history("g") == ([1, 2], {"acc": [0.1, 0.3]})


def test_nan_reads_back_as_nan_and_gaps_are_nan(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"a": math.nan, "b": 1.0}, step=1, group="g")
    keeper.update_records({"b": 2.0}, step=2, group="g")
    steps, values = keeper.history("g")
    assert steps == [1, 2] and values["b"] == [1.0, 2.0]
    assert math.isnan(values["a"][0]) and math.isnan(values["a"][1])
    assert keeper.history("unknown") == ([], {})


def test_set_aside_after_moves_rows_out_of_sqlite_and_csv(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    for step in range(1, 6):
        keeper.update_records({"acc": step / 10, "odd/name": step}, step=step, group="g")
    keeper.update_records({"acc": 9.0}, step=5, group="other")
    keeper.set_aside_after("g", 3)
    assert keeper.history("g") == ([1, 2, 3], {"acc": [0.1, 0.2, 0.3], "odd/name": [1.0, 2.0, 3.0]})
    assert keeper.history("other") == ([5], {"acc": [9.0]})
    assert read_csv(keeper.csv_path("g", "acc")) == [
        ["step", "acc"],
        ["1", "0.1"],
        ["2", "0.2"],
        ["3", "0.3"],
    ]
    assert len(read_csv(keeper.csv_path("g", "odd/name"))) == 4
    # Recoverable: the rows after step 3 are in superseded_records, not gone.
    with sqlite3.connect(tmp_path / "records.db") as conn:
        sql = "SELECT name, step, value FROM superseded_records ORDER BY name, step"
        moved = conn.execute(sql).fetchall()
    assert moved == [("acc", 4, 0.4), ("acc", 5, 0.5), ("odd/name", 4, 4.0), ("odd/name", 5, 5.0)]


def test_query_binds_parameters(tmp_path: Path) -> None:
    db = SQLiteManager(tmp_path / "r.db")
    from pytorch_metric_learning.utils.record_keeping import Record

    db.write([Record("g", "a", 1, 0.5, 0.0), Record("g", "b", 1, 0.7, 0.0)])
    rows = db.query("SELECT name, value FROM records WHERE name = ?", ("a' OR '1'='1",))
    assert rows == []
    assert db.query("SELECT name FROM records WHERE value > :v", {"v": 0.6}) == [{"name": "b"}]
    assert db.table_exists("records") and not db.table_exists("nope")
    assert db.groups() == ["g"]


def test_tensorboard_writer_receives_every_scalar(tmp_path: Path) -> None:
    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []
            self.flushes = 0

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

        def flush(self) -> None:
            self.flushes += 1

    writer = Writer()
    keeper = RecordKeeper(tmp_path, tensorboard_writer=writer)
    keeper.update_records({"a": 1.0, "b": 2.0}, step=3, group="g")
    keeper.save_records()
    assert writer.scalars == [("g/a", 1.0, 3), ("g/b", 2.0, 3)] and writer.flushes == 1


def test_real_tensorboard_event_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    keeper, _, writer = get_record_keeper(tmp_path / "csv", tmp_path / "tb")
    for step in range(3):
        keeper.update_records({"precision_at_1_level0": step / 4}, step, "accuracies_val")
    keeper.save_records()
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = events.Scalars("accuracies_val/precision_at_1_level0")
    assert [(s.step, s.value) for s in scalars] == [(0, 0.0), (1, 0.25), (2, 0.5)]


def test_missing_tensorboard_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    from pytorch_metric_learning.evaluation.search._install_hint import extra_install_hint

    hint = extra_install_hint(
        "tensorboard"
    )  # its forms: tests/evaluation/search/test_install_hint.py
    assert "[tensorboard]" in hint or "tensorboard>=" in hint
    with pytest.raises(BackendNotInstalledError, match=re.escape(hint)):
        get_record_keeper(tmp_path, tmp_path / "tb")
    keeper, db, writer = get_record_keeper(tmp_path, db_path=tmp_path / "elsewhere" / "x.db")
    assert writer is None and db.path == tmp_path / "elsewhere" / "x.db"
    assert keeper.sqlite_manager is db


def test_closed_manager_reopens(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    keeper.update_records({"a": 1.0}, 1, "g")
    keeper.save_records()
    keeper.sqlite_manager.close()
    keeper.update_records({"a": 2.0}, 2, "g")
    assert keeper.history("g") == ([1, 2], {"a": [1.0, 2.0]})
