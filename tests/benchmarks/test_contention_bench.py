"""benchmarks/contention.py: its neighbour process, its bookkeeping, and a small real run."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from ._scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("contention")


def _run(*seconds: float) -> dict:
    return {"seconds": list(seconds), "setup": 0.1, "recall_at_1": 0.5}


def test_summary_is_the_median_first_and_later_call(bench) -> None:
    summary = bench.summarize([_run(3.0, 1.0, 2.0), _run(1.0, 5.0), _run(2.0, 4.0, 6.0)])
    assert summary["first"] == 2.0  # median of 3, 1, 2
    assert summary["later"] == 5.0  # median of each process's later median: 1.5, 5, 5
    assert summary["first_all"] == [3.0, 1.0, 2.0]


def test_summary_skips_failed_processes(bench) -> None:
    assert bench.summarize([{"error": "boom"}, _run(2.0)])["first"] == 2.0
    assert bench.summarize([{"error": "boom"}]) == {"error": "boom"}


def test_a_row_shows_the_ratios_and_marks_the_missed_goals(bench) -> None:
    cell = {
        "default": bench.summarize([_run(2.0, 1.0)]),
        "one": bench.summarize([_run(1.0, 1.0)]),
        "pml29": bench.summarize([_run(4.0, 1.2)]),
    }
    line = bench.row(20_000, 100, "busy", cell)
    assert "first: default/one  2.00! pml29/default  2.00 " in line
    assert "later: default/one  1.00  pml29/default  1.20!" in line


def test_a_row_without_some_sides_shows_no_ratio(bench) -> None:
    cell = {"default": bench.summarize([_run(2.0, 1.0)]), "pml29": {"error": "no venv"}}
    line = bench.row(20_000, 100, "idle", cell)
    assert "pml29 failed (no venv)" in line
    assert "default/one   -  " in line


def test_the_neighbour_spins_on_one_of_our_cores_and_is_stopped(bench) -> None:
    with bench.Neighbour(limit=600.0) as neighbour:
        process = neighbour.process
        assert os.sched_getaffinity(process.pid) == {max(os.sched_getaffinity(0))}
        assert process.poll() is None
    assert process.poll() is not None


def test_the_neighbour_stops_by_itself_at_its_limit(bench) -> None:
    with bench.Neighbour(limit=0.0) as neighbour:
        assert neighbour.process.wait(timeout=60) == 0  # ended on its own


def test_data_are_unit_norm_with_the_classes_asked_for(bench) -> None:
    x, labels = bench.make_data(500, 8, 7, 0)
    assert x.shape == (500, 8) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert set(labels.tolist()) <= set(range(7))


@pytest.mark.slow
@pytest.mark.parametrize("side", ["default", "one", "off"])
def test_a_small_run_of_ours_reports_times_and_recall(bench, tmp_path, side) -> None:
    x, labels = bench.make_data(300, 16, 5, 0)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "labels.npy", labels)
    run = bench.measure(sys.executable, side, str(tmp_path), calls=2, timeout=300)
    assert "error" not in run, run
    assert len(run["seconds"]) == 2
    # oracle: recall@1 by brute force (the nearest other row has the same label)
    distances = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(distances, np.inf)
    expected = float(np.mean(labels[distances.argmin(axis=1)] == labels))
    assert run["recall_at_1"] == pytest.approx(expected)
