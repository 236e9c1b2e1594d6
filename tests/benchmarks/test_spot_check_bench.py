"""benchmarks/spot_check.py runs, and times the check it claims to time (no speed asserted)."""

from __future__ import annotations

from unittest import mock

from ._scripts import load_script


def test_measure_times_the_search_and_the_spot_check() -> None:
    bench = load_script("spot_check")
    knn = bench._backends()["custom"]
    with mock.patch.object(bench, "spot_check_knn", wraps=bench.spot_check_knn) as spy:
        search, check = bench.measure(knn, 300, 8, 5)
    assert search > 0 and check > 0
    assert spy.call_count == 5  # best of five runs of the check
    assert spy.call_args.kwargs["name"] == "bench"
