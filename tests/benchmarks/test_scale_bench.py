"""benchmarks/scale.py and benchmarks/oml.py: their bookkeeping, and a small real run."""

from __future__ import annotations

import numpy as np
import pytest

from ._scripts import load_script


@pytest.fixture(scope="module")
def scale():
    return load_script("scale")


@pytest.fixture(scope="module")
def oml():
    return load_script("oml")


def _record(rows: int, classes: int, seconds: float, queries: int = 0) -> dict:
    pairs = queries * (rows - queries) if queries else rows * (rows - 1)
    mib = 2**20
    return {
        "rows": rows,
        "classes": classes,
        "queries": queries,
        "seconds": seconds,
        "pairs": pairs,
        "peak": 900 * mib,
        "base": 300 * mib,
        "inputs": 100 * mib,
    }


def test_time_per_pair_is_compared_with_the_50k_row_of_the_same_classes(scale) -> None:
    fifty = _record(50_000, 100, 10.0)
    hundred = _record(100_000, 100, 48.0)
    other_classes = _record(50_000, 1000, 1.0)
    records = [other_classes, fifty, hundred]
    expected = (48.0 / hundred["pairs"]) / (10.0 / fifty["pairs"])
    assert scale.ratio_to_reference(hundred, records) == pytest.approx(expected)
    assert f"{expected:.2f}x the 50k row's" in scale.closing_note(records)


def test_a_row_flags_growth_beyond_inputs_plus_the_budget(scale) -> None:
    record = _record(50_000, 100, 10.0)  # grew 600 MiB with 100 MiB of inputs
    assert "| no |" in scale.table_row(record, [record], 499)
    assert "| yes |" in scale.table_row(record, [record], 500)


def test_the_data_is_written_in_blocks_with_one_label_per_row(scale, tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "BLOCK_ROWS", 7)
    scale.write_data(tmp_path, 30, 4, 3, seed=0)
    x, labels = np.load(tmp_path / "x.npy"), np.load(tmp_path / "labels.npy")
    assert x.shape == (30, 4) and x.dtype == np.float32
    assert labels.shape == (30,) and set(labels.tolist()) <= {0, 1, 2}


def test_oml_agreement_is_asserted_to_the_tolerance(oml) -> None:
    ours = {"metrics": {"recall_at_1": 0.5, "recall_at_5": 0.75}}
    close = {"metrics": {"recall_at_1": 0.5 + 5e-7, "recall_at_5": 0.75}}
    far = {"metrics": {"recall_at_1": 0.5, "recall_at_5": 0.75 + 1e-5}}
    assert oml.check_agreement(ours, close) == pytest.approx(5e-7)
    with pytest.raises(AssertionError, match="differ"):
        oml.check_agreement(ours, far)


@pytest.mark.slow
def test_a_small_run_reports_time_memory_and_inputs(scale, tmp_path) -> None:
    scale.write_data(tmp_path, 500, 8, 5, seed=0)
    self_search = scale.measure(tmp_path, 0, 1)
    gallery = scale.measure(tmp_path, 100, 1)
    for run in (self_search, gallery):
        assert "error" not in run, run
        assert run["peak"] >= run["base"] > 0
        assert run["inputs"] == 500 * 8 * 4 + 500 * 8
    assert self_search["pairs"] == 500 * 499
    assert gallery["pairs"] == 100 * 400
    assert "NMI" in self_search["metrics"] and "NMI" not in gallery["metrics"]
