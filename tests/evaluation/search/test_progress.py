"""The progress bar of long searches: drawn on a terminal only, silent otherwise, and
counting every scored pair exactly once on each search path."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.evaluation.search import (
    _compiled_search,
    _compiled_topk,
    _progress,
    _tiled_search,
)
from pytorch_metric_learning.evaluation.search import knn as knn_module
from pytorch_metric_learning.evaluation.search.knn import CustomKNN


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Recorded(_progress.SearchProgress):
    """A SearchProgress that remembers its total and what was counted."""

    made: list[Recorded] = []

    def __init__(self, total: int, description: str = "k-NN search") -> None:
        super().__init__(total, description)
        self.total, self.counted = total, 0
        Recorded.made.append(self)

    def update(self, pairs: int) -> None:
        self.counted += pairs
        super().update(pairs)


@pytest.fixture()
def recorded(monkeypatch):
    Recorded.made = []
    for module in (knn_module, _compiled_search, _tiled_search):
        monkeypatch.setattr(module, "SearchProgress", Recorded)
    monkeypatch.setattr(_progress, "DELAY_SECONDS", 0.0)
    monkeypatch.delenv(_progress.DISABLE_ENV, raising=False)
    return Recorded.made


def _compiled(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0 if on else 2**62)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    monkeypatch.setattr(knn_module, "COMPILED_TILE", 32)
    monkeypatch.setattr(_compiled_topk, "MIN_PART", 1)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "mode", ["self", "self, drop own", "separate", "symmetric tiles", "batch_size"]
)
def test_each_path_counts_every_pair_once(recorded, monkeypatch, compiled, threads, mode):
    """A symmetric self-search (the compiled one, or the PyTorch walk of symmetric tiles,
    forced here for "symmetric tiles" and "batch_size") scores each unordered pair, and each
    row with itself, once: n (n + 1) / 2 pairs; a self-search in whole rows n x n; a
    separate search n x m."""
    _compiled(monkeypatch, compiled)
    symmetric = compiled or mode in ("symmetric tiles", "batch_size")
    if symmetric:
        monkeypatch.setattr(knn_module, "SYMMETRIC_ROWS_PER_CANDIDATE", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        query = torch.randn(300, 8)
        reference = torch.randn(170, 8) if mode == "separate" else None
        k = 40
        knn = CustomKNN(LpDistance(power=2), batch_size=64 if mode == "batch_size" else None)
        knn(query, k, reference, ref_includes_query=mode == "self, drop own")
    finally:
        torch.set_num_threads(before)
    assert len(recorded) == 1
    expected = 300 * 301 // 2 if symmetric else 300 * 300
    expected = 300 * 170 if mode == "separate" else expected
    assert (recorded[0].total, recorded[0].counted) == (expected, expected)


def test_other_distances_count_their_blocks(recorded, monkeypatch):
    _compiled(monkeypatch, False)
    CustomKNN(CosineSimilarity())(torch.randn(50, 4), 3, torch.randn(70, 4))
    assert (recorded[0].total, recorded[0].counted) == (50 * 70, 50 * 70)


def test_the_bar_is_drawn_on_a_terminal(recorded, monkeypatch):
    _compiled(monkeypatch, True)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    CustomKNN(LpDistance(power=2))(torch.randn(100, 4), 5)
    assert "k-NN search" in terminal.getvalue()


@pytest.mark.parametrize("disable", ["1", "yes"])
def test_the_environment_variable_turns_it_off(recorded, monkeypatch, disable):
    _compiled(monkeypatch, True)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv(_progress.DISABLE_ENV, disable)
    CustomKNN(LpDistance(power=2))(torch.randn(100, 4), 5)
    assert terminal.getvalue() == ""


def test_silent_when_not_a_terminal(recorded, monkeypatch):
    _compiled(monkeypatch, True)
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    CustomKNN(LpDistance(power=2))(torch.randn(100, 4), 5)
    assert pipe.getvalue() == ""
    assert recorded[0].counted == 100 * 101 // 2  # counted all the same


def test_zero_disables_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setenv(_progress.DISABLE_ENV, "0")
    assert _progress.progress_enabled()
