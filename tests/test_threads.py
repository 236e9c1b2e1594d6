"""The thread count of large computations: the user's, else capped by the free cores."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning import _threads
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.search import _compiled_topk
from pytorch_metric_learning.evaluation.search import knn as knn_module
from pytorch_metric_learning.evaluation.search.knn import CustomKNN, default_custom_knn

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_user_count(monkeypatch):
    """No count from the environment, a fresh measurement each call, torch's count kept."""
    for name in (_threads.ENV, *_threads.OPENMP_ENVS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(_threads._state, "measured_at", -math.inf)
    monkeypatch.setattr(_threads, "_TORCH_THREADS_AT_IMPORT", torch.get_num_threads())
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _pretend(monkeypatch, torch_threads: int, free: float | None) -> None:
    torch.set_num_threads(torch_threads)
    monkeypatch.setattr(_threads, "_TORCH_THREADS_AT_IMPORT", torch_threads)
    monkeypatch.setattr(_threads, "free_cores", lambda window=_threads.WINDOW: free)


@given(
    torch_threads=st.integers(1, 8),
    free=st.one_of(st.none(), st.floats(0.0, 8.0, allow_nan=False)),
)
def test_the_count_is_the_free_cores_capped_by_torch(torch_threads, free) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _pretend(monkeypatch, torch_threads, free)
        monkeypatch.setitem(_threads._state, "measured_at", -math.inf)
        chosen = _threads.choose_threads()
    # oracle: the cores at least FREE_FRACTION free, counted one by one
    cores = 0
    while free is not None and cores + _threads.FREE_FRACTION <= free + 1e-12:
        cores += 1
    expected = torch_threads if free is None else max(1, min(torch_threads, cores))
    assert chosen == expected


def test_a_busy_core_leaves_one_thread_and_idle_cores_all(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    assert _threads.choose_threads() == 1
    monkeypatch.setitem(_threads._state, "measured_at", -math.inf)
    _pretend(monkeypatch, 2, 2.0)
    assert _threads.choose_threads() == 2


@pytest.mark.parametrize("value", ["3", " 3 "])
def test_the_environment_variable_wins(monkeypatch, value) -> None:
    _pretend(monkeypatch, 2, 0.0)
    monkeypatch.setenv(_threads.ENV, value)
    assert _threads.choose_threads() == 3


def test_zero_keeps_torch_count_without_measuring(monkeypatch) -> None:
    torch.set_num_threads(2)
    monkeypatch.setenv(_threads.ENV, "0")
    monkeypatch.setattr(_threads, "free_cores", pytest.fail)
    assert _threads.choose_threads() == 2


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_bad_environment_variable_is_named(monkeypatch, value) -> None:
    monkeypatch.setenv(_threads.ENV, value)
    with pytest.raises(InvalidArgumentError, match=f"{_threads.ENV}.*{value!r}"):
        _threads.choose_threads()


@pytest.mark.parametrize("name", _threads.OPENMP_ENVS)
def test_an_openmp_count_wins(monkeypatch, name) -> None:
    _pretend(monkeypatch, 2, 0.0)
    monkeypatch.setenv(name, "2")
    assert _threads.choose_threads() == 2


def test_torch_set_num_threads_after_import_wins(monkeypatch) -> None:
    _pretend(monkeypatch, 1, 0.0)
    torch.set_num_threads(2)  # differs from the count at import
    assert _threads.user_threads() == 2
    assert _threads.choose_threads() == 2


def test_a_measurement_serves_calls_within_reuse_seconds(monkeypatch) -> None:
    calls = []
    _pretend(monkeypatch, 2, 1.0)
    monkeypatch.setattr(_threads, "free_cores", lambda window=0.0: calls.append(1) or 1.0)
    _threads.choose_threads()
    _threads.choose_threads()
    assert len(calls) == 1


def test_free_cores_subtracts_own_cpu_time(monkeypatch) -> None:
    cores = len(__import__("os").sched_getaffinity(0))
    busy = iter([100.0, 100.0 + 0.5 * 0.04 + 0.01])  # others: half a core; self: 0.01 s
    own = iter([5.0, 5.01])
    clock = iter([0.0, 0.04])
    monkeypatch.setattr(_threads, "_busy_seconds", lambda cpus: next(busy))
    monkeypatch.setattr(_threads.time, "process_time", lambda: next(own))
    monkeypatch.setattr(_threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(_threads.time, "sleep", lambda seconds: None)
    assert _threads.free_cores() == pytest.approx(cores - 0.5)


def test_unreadable_stat_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(_threads, "_busy_seconds", lambda cpus: None)
    assert _threads.free_cores() is None
    monkeypatch.delattr(_threads.os, "sched_getaffinity")  # macOS, Windows
    assert _threads.free_cores() is None
    _pretend(monkeypatch, 2, None)
    assert _threads.choose_threads() == 2


def test_the_block_runs_on_the_choice_and_restores(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    with _threads.adapted_threads(_threads.MIN_PAIRS, CPU) as threads:
        assert threads == torch.get_num_threads() == 1
        with _threads.adapted_threads(_threads.MIN_PAIRS, CPU) as inner:  # nested: shared
            assert inner == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_the_count_is_restored_after_an_error(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    with pytest.raises(KeyError), _threads.adapted_threads(_threads.MIN_PAIRS, CPU):
        raise KeyError("x")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(
    "pairs, device", [(_threads.MIN_PAIRS - 1, CPU), (_threads.MIN_PAIRS, torch.device("meta"))]
)
def test_small_or_non_cpu_work_is_left_alone(monkeypatch, pairs, device) -> None:
    _pretend(monkeypatch, 2, 0.0)
    monkeypatch.setattr(_threads, "free_cores", pytest.fail)
    with _threads.adapted_threads(pairs, device) as threads:
        assert threads == torch.get_num_threads() == 2


def _record_threads(monkeypatch, owner: type, name: str) -> list[int]:
    """Record torch's thread count inside ``owner.name``."""
    seen: list[int] = []
    original = getattr(owner, name)

    def recording(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return seen


def test_a_large_search_runs_on_the_free_cores(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    monkeypatch.setattr(_threads, "MIN_PAIRS", 100)
    seen = _record_threads(monkeypatch, CustomKNN, "_search")
    x = torch.randn(20, 4)
    distances, indices = default_custom_knn()(x, 3, None, True)
    # oracle: brute force over every pair
    brute = torch.cdist(x.double(), x.double()) ** 2
    brute.fill_diagonal_(float("inf"))
    assert torch.allclose(distances.double(), brute.sort(dim=1).values[:, :3], atol=1e-4)
    assert seen == [1] and torch.get_num_threads() == 2


def test_get_accuracy_runs_on_the_free_cores(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    monkeypatch.setattr(_threads, "MIN_PAIRS", 100)
    seen = _record_threads(monkeypatch, CustomKNN, "_search")
    x = torch.randn(30, 4)
    labels = torch.arange(30) % 3
    AccuracyCalculator(include=("precision_at_1",)).get_accuracy(x, labels)
    assert seen == [1] and torch.get_num_threads() == 2


def test_dynamic_work_adds_a_thread_per_busy_core(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    assert _threads.dynamic_threads() == 2
    with _threads.adapted_threads(_threads.MIN_PAIRS, CPU):
        assert torch.get_num_threads() == 1
        assert _threads.dynamic_threads() == 3  # two cores, one of them busy


@given(
    torch_threads=st.integers(1, 8),
    free=st.one_of(st.none(), st.floats(0.0, 8.0, allow_nan=False)),
)
def test_dynamic_work_runs_a_thread_per_core_and_one_more_per_busy_core(
    torch_threads, free
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _pretend(monkeypatch, torch_threads, free)
        monkeypatch.setitem(_threads._state, "measured_at", -math.inf)
        with _threads.adapted_threads(_threads.MIN_PAIRS, CPU):
            chosen, dynamic = torch.get_num_threads(), _threads.dynamic_threads()
    # oracle: the cores at least FREE_FRACTION free, counted one by one (at least one)
    cores = 0
    while free is not None and cores + _threads.FREE_FRACTION <= free + 1e-12:
        cores += 1
    free_ones = torch_threads if free is None else max(1, min(torch_threads, cores))
    assert chosen == free_ones
    assert dynamic == torch_threads + (torch_threads - free_ones)


def test_dynamic_work_follows_a_user_count(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 2.0)
    monkeypatch.setenv(_threads.ENV, "1")
    with _threads.adapted_threads(_threads.MIN_PAIRS, CPU):
        assert torch.get_num_threads() == _threads.dynamic_threads() == 1


@pytest.mark.skipif(not _compiled_topk.available(), reason="the compiled loops are unavailable")
def test_the_compiled_search_takes_its_tiles_on_every_thread(monkeypatch) -> None:
    _pretend(monkeypatch, 2, 1.0)
    monkeypatch.setattr(_threads, "MIN_PAIRS", 100)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    seen = _record_threads(monkeypatch, CustomKNN, "_search")
    made: list[int | None] = []
    original = _compiled_topk.CompiledTopK.__init__

    def recording(self, num_rows, k, threads=None):
        made.append(threads)
        original(self, num_rows, k, threads)

    monkeypatch.setattr(_compiled_topk.CompiledTopK, "__init__", recording)
    x = torch.randn(50, 4)
    distances, _ = default_custom_knn()(x, 3, None, True)
    brute = torch.cdist(x.double(), x.double()) ** 2  # oracle: every pair
    brute.fill_diagonal_(float("inf"))
    assert torch.allclose(distances.double(), brute.sort(dim=1).values[:, :3], atol=1e-4)
    assert seen == [1] and made == [3]  # two cores, one busy: a thread more


def test_busy_cores_do_not_hasten_loading_numba(monkeypatch) -> None:
    """Both walks hand their tiles to every thread, so the load of the machine does not
    change which one serves a search: below COMPILED_LOAD_PAIRS, PyTorch's."""
    pairs = 300 * 300
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", pairs)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 2 * pairs)
    monkeypatch.setattr(knn_module, "_cold_pairs", 0)
    monkeypatch.setattr(_compiled_topk, "loaded", lambda: False)
    monkeypatch.setattr(_compiled_topk, "installed", lambda: True)
    monkeypatch.setattr(_compiled_topk, "available", pytest.fail)  # would import numba
    x = torch.randn(300, 4)
    search = default_custom_knn()
    assert search._walk(x, x, 5) is False  # idle: the PyTorch walk
    monkeypatch.setattr(knn_module, "_cold_pairs", 0)
    _pretend(monkeypatch, 2, 1.0)
    with _threads.adapted_threads(_threads.MIN_PAIRS, CPU):
        assert search._walk(x, x, 5) is False  # busy: the same
