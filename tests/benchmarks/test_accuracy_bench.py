"""benchmarks/accuracy.py: its bookkeeping of first, cold and later calls, and a small real run."""

from __future__ import annotations

import sys

import pytest

from ._scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("accuracy")


def _run(first: float, later: float, setup: float) -> dict:
    return {
        "seconds": [first, later],
        "cpu": [2 * first, 2 * later],
        "setup_seconds": setup,
        "setup_cpu": setup,
        "peak_mb": 100.0,
        "growth_mb": 10.0,
        "metrics": {"precision_at_1": 0.5},
    }


def test_cold_is_the_best_sum_of_setup_and_first_call_of_one_process(bench) -> None:
    # The fastest first call (1.0) and the fastest setup (0.1) come from different
    # processes: cold must not add them up across processes.
    best = bench.best_of([_run(1.0, 0.8, 2.0), _run(1.5, 0.7, 0.1)])
    assert best["first_seconds"] == 1.0
    assert best["later_seconds"] == 0.7
    assert best["cold_seconds"] == pytest.approx(1.6)
    assert best["cold_cpu"] == pytest.approx(3.1)


def test_a_row_reports_first_cold_and_later_ratios(bench) -> None:
    ours = bench.best_of([_run(1.0, 0.5, 0.1)])
    other = bench.best_of([_run(2.0, 1.5, 1.1)])
    line = bench.row(1000, 10, "pml29", ours, other)
    assert "first   1.00 vs   2.00 s x 2.00" in line
    assert "cold   1.10 vs   3.10 s x 2.82" in line
    assert "later   0.50 vs   1.50 s x 3.00" in line


@pytest.mark.slow
def test_a_small_run_of_ours_reports_times_setup_and_metrics(bench, tmp_path) -> None:
    import numpy as np

    x, labels = bench.make_data(400, 16, 5, 0)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "labels.npy", labels)
    run = bench.measure(sys.executable, "ours", str(tmp_path), "none", calls=2)
    assert "error" not in run, run
    assert len(run["seconds"]) == 2
    assert run["setup_seconds"] > 0
    assert 0 <= run["metrics"]["precision_at_1"] <= 1
