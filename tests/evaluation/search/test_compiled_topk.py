"""The compiled (numba) running top-k and the search built on it, against brute force."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_knn_tiled import FAST, assert_top_k, brute_force_values, integer_points

from pytorch_metric_learning.distances import LpDistance, SNRDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search import _compiled_topk
from pytorch_metric_learning.evaluation.search._tiled_search import (
    SeparateSquaredEuclidean,
    SquaredEuclidean,
)

knn_module = importlib.import_module("pytorch_metric_learning.evaluation.search.knn")
search_module = importlib.import_module(
    "pytorch_metric_learning.evaluation.search._compiled_search"
)

# Skipped only without numba: loops that numba cannot load or that fail their load check
# make these tests fail, not skip.
pytestmark = pytest.mark.skipif(not _compiled_topk.installed(), reason="numba is not installed")


def test_the_loops_load_and_pass_their_check() -> None:
    assert _compiled_topk.available()


@st.composite
def tiled_matrix(draw):
    """A float32 matrix with many exact ties, cut into column tiles, and a k."""
    rows = draw(st.integers(1, 12))
    widths = draw(st.lists(st.integers(1, 300), min_size=1, max_size=4))
    k = draw(st.integers(1, sum(widths)))
    levels = draw(st.sampled_from([2, 40, 100_000]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, levels, (rows, sum(widths)), generator=generator).float()
    return matrix, widths, k


def _tiles(matrix, widths):
    start = 0
    for width in widths:
        yield start, matrix[:, start : start + width]
        start += width


BUFFER_ROWS = st.sampled_from([1, 3, 2048])  # rows per candidate buffer


@settings(max_examples=150, deadline=None)
@given(problem=tiled_matrix(), threads=st.sampled_from([1, 2]), buffer_rows=BUFFER_ROWS)
def test_rows_fed_tile_by_tile_equal_sorting(problem, threads, buffer_rows) -> None:
    matrix, widths, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_compiled_topk, "MIN_PART", 1)  # split even one-row tiles over threads
        patch.setattr(_compiled_topk, "ROWS_PER_BUFFER", buffer_rows)
        values, indices = _fed(matrix, widths, k, threads, by_rows=True)
    assert_top_k(values.numpy(), indices.numpy(), matrix.double().numpy(), k)
    _assert_ties_by_index(values, indices)


def _assert_ties_by_index(values, indices):
    """Equal values come in increasing index order, whatever the tiles and threads."""
    tied = values[:, 1:] == values[:, :-1]
    assert bool((indices[:, 1:][tied] > indices[:, :-1][tied]).all())


def _fed(matrix, widths, k, threads, by_rows):
    return feed_tiles(_compiled_topk.CompiledTopK(len(matrix), k, threads), matrix, widths, by_rows)


def feed_tiles(state, matrix, widths, by_rows):
    """Feed the column tiles of ``matrix`` through their rows (or the transposed tiles
    through their columns) and finish."""
    for start, tile in _tiles(matrix, widths):
        if by_rows:
            state.push_rows(0, tile, start)
        else:
            state.push_columns(0, tile.T.contiguous(), start)
    return state.finish()


@settings(max_examples=150, deadline=None)
@given(problem=tiled_matrix(), threads=st.sampled_from([1, 2]), buffer_rows=BUFFER_ROWS)
def test_columns_fed_tile_by_tile_equal_sorting(problem, threads, buffer_rows) -> None:
    """Tiles of the transposed matrix feed the rows through their columns."""
    matrix, widths, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_compiled_topk, "MIN_PART", 1)
        patch.setattr(_compiled_topk, "ROWS_PER_BUFFER", buffer_rows)
        values, indices = _fed(matrix, widths, k, threads, by_rows=False)
    assert_top_k(values.numpy(), indices.numpy(), matrix.double().numpy(), k)
    _assert_ties_by_index(values, indices)


@st.composite
def symmetric_matrix(draw):
    """A symmetric float32 matrix with many exact ties, a tile side and a k."""
    n = draw(st.integers(2, 40))
    levels = draw(st.sampled_from([2, 40, 100_000]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, levels, (n, n), generator=generator).float()
    return torch.minimum(matrix, matrix.T), draw(st.integers(1, n)), draw(st.integers(1, n))


@settings(max_examples=150, deadline=None)
@given(problem=symmetric_matrix(), threads=st.sampled_from([1, 2, 3]), buffer_rows=BUFFER_ROWS)
def test_tiles_fed_through_rows_and_columns_at_once_equal_sorting(
    problem, threads, buffer_rows
) -> None:
    """The tiles on and above the diagonal of a symmetric matrix: ``push_both`` feeds the
    rows of both its row block and its column block."""
    matrix, side, k = problem
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_compiled_topk, "MIN_PART", 1)
        patch.setattr(_compiled_topk, "ROWS_PER_BUFFER", buffer_rows)
        state = _compiled_topk.CompiledTopK(len(matrix), k, threads=threads)
        values, indices = feed_symmetric(state, matrix, side)
    assert_top_k(values.numpy(), indices.numpy(), matrix.double().numpy(), k)
    _assert_ties_by_index(values, indices)


def feed_symmetric(state, matrix, side):
    """Feed the tiles on and above the diagonal of a symmetric ``matrix`` (each off the
    diagonal through both its rows and its columns) and finish."""
    for r0 in range(0, len(matrix), side):
        for c0 in range(r0, len(matrix), side):
            tile = matrix[r0 : r0 + side, c0 : c0 + side]
            if c0 == r0:
                state.push_rows(r0, tile, c0)
            else:
                state.push_both(r0, tile, c0)
    return state.finish()


def test_push_both_takes_tiles_off_the_diagonal_only() -> None:
    state = _compiled_topk.CompiledTopK(10, 2)
    with pytest.raises(ValueError, match="off the diagonal"):
        state.push_both(0, torch.zeros(4, 4), 2)


@settings(max_examples=100, deadline=None)
@given(problem=tiled_matrix(), low=st.floats(-1.0, 1e5))
def test_a_preset_bound_keeps_every_value_below_it(problem, low) -> None:
    """With a bound set beforehand, the rows keep the k smallest values below it."""
    matrix, widths, k = problem
    state = _compiled_topk.CompiledTopK(len(matrix), k)
    state.bound[:] = low
    for start, tile in _tiles(matrix, widths):
        state.push_rows(0, tile, start)
    below = (matrix < np.float32(low)).sum(dim=1)
    full = torch.from_numpy(state.count >= k)
    assert torch.equal(full, below >= k)  # a row is short exactly when the bound was too low
    values, indices = state.finish()
    table = matrix.double().numpy()
    assert_top_k(values[full].numpy(), indices[full].numpy(), table[full.numpy()], k)


@settings(max_examples=100, deadline=None)
@given(problem=tiled_matrix())
def test_kth_smallest_equals_partition(problem) -> None:
    matrix, _, k = problem
    state = _compiled_topk.CompiledTopK(len(matrix), 1)
    expected = np.partition(matrix.numpy(), k - 1, axis=1)[:, k - 1]
    np.testing.assert_array_equal(state.kth_smallest(matrix, k).numpy(), expected)


@pytest.fixture()
def compiled_everywhere(monkeypatch):
    """Every float32 CPU search runs compiled, over 32 x 32 tiles (a 32-row sample)."""
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    monkeypatch.setattr(knn_module, "COMPILED_TILE", 32)
    monkeypatch.setattr(_compiled_topk, "MIN_PART", 1)
    monkeypatch.setattr(_compiled_topk, "ROWS_PER_BUFFER", 20)  # tiles span two buffers


# A search problem for search_as_brute_force: spread -100 makes most sampled bounds too low.
SEARCH_PROBLEMS = {
    "problem": integer_points(),
    "distance_index": st.integers(0, len(FAST) - 1),
    "mode": st.sampled_from(["none", "is", "separate", "drop self"]),
    "spread": st.sampled_from([3.0, -100.0]),
}


@settings(max_examples=80, deadline=None)
@given(
    **SEARCH_PROBLEMS,
    buffer_rows=st.sampled_from([20, 2048]),
    threads=st.sampled_from([1, 2]),
    blocks=st.sampled_from([(512, 1024), (8, 12)]),
)
def test_compiled_search_equals_brute_force(
    problem, distance_index, mode, spread, buffer_rows, threads, blocks
) -> None:
    """Self and separate search, with ties and duplicate points; spread -100 makes most
    sampled bounds too low, so those rows are searched again whole. "drop self" leaves each
    row's own index out (ref_includes_query). Buffers of 20 rows split the 32-row tiles,
    so self-search feeds rows and columns apart; with 2048 it feeds both at once. On two
    threads the walks split their tiles between the threads. A separate search computes
    its tiles in blocks of ``blocks`` rows and columns (8 x 12 cuts the 32-square tiles
    unevenly)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_module, "BLOCK_ROWS", blocks[0])
        patch.setattr(search_module, "BLOCK_COLUMNS", blocks[1])
        patch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
        patch.setattr(_compiled_topk, "MIN_PART", 1)
        patch.setattr(_compiled_topk, "ROWS_PER_BUFFER", buffer_rows)
        search_as_brute_force(patch, problem, FAST[distance_index], mode, (spread, threads))


def search_as_brute_force(patch, problem, distance, mode, walk) -> None:
    """Search ``problem`` (``integer_points``) over 32-square tiles from the first search
    on (the walk's ``(SPREAD, threads)``) and compare it with brute force."""
    spread, threads = walk
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    patch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    patch.setattr(knn_module, "COMPILED_TILE", 32)
    patch.setattr(search_module, "SPREAD", spread)
    query, reference, k = problem
    query, reference = query.float() + 0.5, reference.float() + 0.5  # float32, no zero rows
    reference = query if mode != "separate" else reference
    drop = mode == "drop self"
    k = min(k, len(reference) - drop)
    if k == 0:
        torch.set_num_threads(before)
        return
    reference_arg = None if mode in ("none", "drop self") else reference
    try:
        values, indices = CustomKNN(distance)(query, k, reference_arg, drop)
    finally:
        torch.set_num_threads(before)
    table = brute_force_values(query, reference, distance)
    if drop:
        assert not (indices == torch.arange(len(query)).unsqueeze(1)).any()
        np.fill_diagonal(table, -np.inf if distance.is_inverted else np.inf)
    _assert_near_top_k(values.numpy(), indices.numpy(), table, k, distance.is_inverted)


def _assert_near_top_k(values, indices, table, k, largest):
    """Like ``assert_top_k`` within float32 rounding, which near zero is the square root of
    a rounding error of the squared distance (about 3e-4)."""
    order = np.sort(-table if largest else table, axis=1)[:, :k]
    expected = -order if largest else order
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(np.take_along_axis(table, indices, 1), expected, atol=1e-3)
    assert all(len(set(row)) == k for row in indices.tolist())


@pytest.fixture()
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_parallel_tiles_set_each_rows_bound_before_feeding_it(
    compiled_everywhere, monkeypatch, two_threads
):
    """On two threads, the sample tile of a row block still sets its rows' bounds before
    any candidate reaches them, and no two threads feed the same row block at once."""
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(8))
    events, feeding = [], []
    lock = threading.Lock()
    state_type = _compiled_topk.CompiledTopK
    original = {name: getattr(state_type, name) for name in ("push_rows", "push_both")}

    def spy(name):
        def call(self, first_row, scores, first_column):
            blocks = {first_row} if name == "push_rows" else {first_row, first_column}
            me = threading.get_ident()
            with lock:  # push_both may call push_rows itself, on its own thread
                others = {block for block, thread in feeding if thread != me}
                assert not blocks & others, "two threads feed one row block"
                feeding.extend((block, me) for block in blocks)
                events.extend(bool(np.isinf(self.bound[row])) for row in blocks)
            try:
                return original[name](self, first_row, scores, first_column)
            finally:
                with lock:
                    for block in blocks:
                        feeding.remove((block, me))

        return call

    for name in original:
        monkeypatch.setattr(state_type, name, spy(name))
    walked = []
    original_walk = search_module._walk_tiles_in_parallel
    monkeypatch.setattr(
        search_module,
        "_walk_tiles_in_parallel",
        lambda *args: walked.append(1) or original_walk(*args),
    )
    values, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 4, None, True)
    assert walked and events and not any(events)
    table = torch.cdist(x.double(), x.double()).numpy() ** 2
    np.fill_diagonal(table, np.inf)
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 4, False)


def test_a_threaded_self_search_computes_every_tile_once_on_one_torch_thread(
    compiled_everywhere, monkeypatch, two_threads
) -> None:
    x = torch.randn(150, 8, generator=torch.Generator().manual_seed(14))
    tiles, inside = [], []
    original_tile = SquaredEuclidean.tile

    def tile(self, rows, cols, out):
        tiles.append((rows.start, cols.start))
        inside.append((threading.get_ident(), torch.get_num_threads()))
        return original_tile(self, rows, cols, out)

    monkeypatch.setattr(SquaredEuclidean, "tile", tile)
    values, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 6)
    assert torch.get_num_threads() == 2
    # five row blocks of 32: the 15 tiles on and below the diagonal, once each
    assert sorted(tiles) == [(r, c) for r in range(0, 150, 32) for c in range(0, r + 1, 32)]
    assert {threads for _, threads in inside} == {1}
    table = torch.cdist(x.double(), x.double()).numpy() ** 2
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 6, False)


def test_an_error_in_one_thread_stops_the_parallel_walk(
    compiled_everywhere, monkeypatch, two_threads
) -> None:
    """A failing tile ends the search with its error; the other thread stops too, and
    PyTorch's thread count is restored."""
    x = torch.randn(150, 8, generator=torch.Generator().manual_seed(15))
    original_tile = SquaredEuclidean.tile

    def tile(self, rows, cols, out):
        if (rows.start, cols.start) == (64, 32):
            raise MemoryError("injected")
        return original_tile(self, rows, cols, out)

    monkeypatch.setattr(SquaredEuclidean, "tile", tile)
    outcome = []

    def search():
        try:
            CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 6)
        except MemoryError as error:
            outcome.append(error)

    runner = threading.Thread(target=search, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "the walk hung after a thread failed"
    assert len(outcome) == 1 and "injected" in str(outcome[0])
    assert torch.get_num_threads() == 2


def _take_soon(schedule, timeout=10.0):
    """``schedule.take()`` in a thread; fails instead of hanging if it does not return."""
    taken = []
    taker = threading.Thread(target=lambda: taken.append(schedule.take()), daemon=True)
    taker.start()
    taker.join(timeout)
    assert not taker.is_alive(), "take() did not return"
    return taken[0]


def _start(tile):
    return tile[0].start, tile[1].start


def test_the_schedule_hands_out_tiles_whose_rows_have_bounds_free_blocks_first() -> None:
    tiles = search_module._tiles(range(0, 96, 32), (96, 96), 32, True)
    walk = SimpleNamespace(rank=3, is_sample=lambda c0: c0 == 0)
    schedule = search_module._Schedule(list(tiles), walk)
    first = _take_soon(schedule)
    assert _start(first) == (0, 0)
    waiting = []
    taker = threading.Thread(target=lambda: waiting.append(schedule.take()), daemon=True)
    taker.start()  # every other tile needs block 0's bounds: it waits
    taker.join(timeout=0.2)
    assert taker.is_alive()
    with schedule.feeding(first):
        taker.join(timeout=10)
    assert _start(waiting[0]) == (32, 0)  # (32, 32) waits for block 32's bounds
    # (64, 0) is allowed but shares block 0 with the tile held: taken all the same
    fourth = _take_soon(schedule)
    assert _start(fourth) == (64, 0)
    with schedule.feeding(waiting[0]):
        pass
    third = _take_soon(schedule)
    assert _start(third) == (32, 32)  # block 32 bounded now; (64, 0) not fed yet
    with schedule.feeding(fourth):  # block 64 bounded
        pass
    # (64, 32) comes first but shares block 32 with the tile held: (64, 64) is preferred
    assert _start(_take_soon(schedule)) == (64, 64)
    assert _start(_take_soon(schedule)) == (64, 32)
    assert _take_soon(schedule) is None


def test_the_schedule_lets_one_thread_at_a_time_feed_a_row_block() -> None:
    tiles = search_module._tiles(range(0, 96, 32), (96, 96), 32, True)
    walk = SimpleNamespace(rank=None, is_sample=lambda c0: False)  # no sample to wait for
    schedule = search_module._Schedule(list(tiles), walk)
    taken = [_take_soon(schedule) for _ in range(4)]
    # the three diagonal tiles share no block; then (32, 0) shares blocks 0 and 32
    assert [_start(tile) for tile in taken] == [(0, 0), (32, 32), (64, 64), (32, 0)]
    fed = []

    def feed():
        with schedule.feeding(taken[3]):
            fed.append(1)

    with schedule.feeding(taken[0]):
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        feeder.join(timeout=0.2)
        assert feeder.is_alive() and not fed  # block 0 is being fed
        with schedule.feeding(taken[2]):  # block 64 is not: no wait
            pass
    feeder.join(timeout=10)
    assert fed == [1]


def test_a_threaded_separate_search_gives_each_thread_whole_row_blocks(
    compiled_everywhere, monkeypatch
) -> None:
    """On two threads a separate search splits its row blocks between the threads, with
    PyTorch on one thread meanwhile (restored afterwards), and equals brute force."""
    query = torch.randn(150, 8, generator=torch.Generator().manual_seed(9))
    reference = torch.randn(90, 8, generator=torch.Generator().manual_seed(10))
    walked, inside = [], []
    original_walk = search_module._walk_row_blocks_in_parallel
    original_tile = SeparateSquaredEuclidean.tile

    def walk(*args):
        walked.append(1)
        return original_walk(*args)

    def tile(self, rows, cols, out):
        inside.append((threading.get_ident(), torch.get_num_threads()))
        return original_tile(self, rows, cols, out)

    monkeypatch.setattr(search_module, "_walk_row_blocks_in_parallel", walk)
    monkeypatch.setattr(SeparateSquaredEuclidean, "tile", tile)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        values, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(
            query, 7, reference
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert walked and len(inside) == 5 * 3  # five row blocks of 32, three tile columns
    assert {threads for _, threads in inside} == {1}
    table = torch.cdist(query.double(), reference.double()).numpy() ** 2
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 7, False)


@pytest.mark.parametrize("separate", [True, False])
def test_separate_searches_compute_tiles_in_blocks(compiled_everywhere, monkeypatch, separate):
    """A separate search computes each 32-square tile in blocks of 8 x 12 (its rows' first
    bounds come from a sample scored apart); a self-search computes whole tiles."""
    monkeypatch.setattr(search_module, "BLOCK_ROWS", 8)
    monkeypatch.setattr(search_module, "BLOCK_COLUMNS", 12)
    shapes = []
    scorer = SeparateSquaredEuclidean if separate else SquaredEuclidean
    original_tile = scorer.tile

    def tile(self, rows, cols, out):
        shapes.append((cols.start, rows.stop - rows.start, cols.stop - cols.start))
        return original_tile(self, rows, cols, out)

    monkeypatch.setattr(scorer, "tile", tile)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(13))
    reference = x.clone() if separate else None
    values, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 5, reference)
    if separate:  # two row blocks of 32 x two tile columns, each tile in 4 x 3 blocks
        assert {shape[1:] for shape in shapes} == {(8, 12), (8, 8)}
        assert len(shapes) == 2 * 2 * 4 * 3
    else:  # the three tiles on and below the diagonal, whole
        assert shapes == [(0, 32, 32), (0, 32, 32), (32, 32, 32)]
    table = torch.cdist(x.double(), x.double()).numpy() ** 2
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 5, False)


def test_tile_buffers_hold_no_more_than_a_tile_of_this_search(compiled_everywhere, monkeypatch):
    sizes = []
    original = search_module._Walk.buffer

    def buffer(self):
        made = original(self)
        sizes.append(len(made))
        return made

    monkeypatch.setattr(search_module._Walk, "buffer", buffer)
    query = torch.randn(40, 4, generator=torch.Generator().manual_seed(11))
    reference = torch.randn(10, 4, generator=torch.Generator().manual_seed(12))
    CustomKNN(LpDistance(normalize_embeddings=False, power=2))(query, 3, reference)
    assert sizes and set(sizes) == {32 * 10}  # 32-row tiles of a 10-row reference


def test_overlapping_searches_restore_the_thread_count_from_before_the_first() -> None:
    """PyTorch's count is per thread: each search's thread runs on one and gets its own
    count back, and the last to end (here a thread new to PyTorch, which started on the
    lowered count) leaves the count from before the first."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    entered, leave, seen = threading.Event(), threading.Event(), {}

    def second_search() -> None:
        with search_module._one_torch_thread():
            seen["inside"] = torch.get_num_threads()
            entered.set()
            leave.wait(timeout=30)
        seen["after"] = torch.get_num_threads()

    try:
        first = search_module._one_torch_thread()
        first.__enter__()
        assert torch.get_num_threads() == 1
        runner = threading.Thread(target=second_search, daemon=True)
        runner.start()
        assert entered.wait(timeout=30)
        first.__exit__(None, None, None)
        assert torch.get_num_threads() == 2  # this thread's count is back
        leave.set()
        runner.join(timeout=30)
        assert not runner.is_alive()
        assert seen == {"inside": 1, "after": 2}
    finally:
        leave.set()
        torch.set_num_threads(before)


def test_compiled_self_search_equals_the_pytorch_paths(compiled_everywhere, monkeypatch) -> None:
    x = torch.randn(700, 16, generator=torch.Generator().manual_seed(3))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    compiled = knn(x, 25, None, True)
    monkeypatch.setenv(_compiled_topk.DISABLE_ENV, "1")
    plain = knn(x, 25, None, True)
    torch.testing.assert_close(compiled[0], plain[0], rtol=1e-5, atol=1e-4)
    assert (compiled[1] == plain[1]).float().mean() > 0.99  # only float near-ties may swap


def _spy_on_compiled_searches(monkeypatch, walks: list | None = None) -> list:
    """The sizes of the walks with the compiled top-k; ``walks`` also gets those of the
    walks with PyTorch's (``_filtered_topk``)."""
    calls = []
    original = knn_module.search_compiled

    def spy(*args, **kwargs):
        (calls if kwargs.get("compiled", True) else walks if walks is not None else []).append(
            args[1]
        )
        return original(*args, **kwargs)

    monkeypatch.setattr(knn_module, "search_compiled", spy)
    return calls


def test_the_compiled_path_serves_float32_cpu_searches_only(monkeypatch) -> None:
    calls = _spy_on_compiled_searches(monkeypatch)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 300 * 300)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    x = torch.randn(300, 4)
    knn(x, 3)
    # each search looks two neighbours past k, to see the rows whose k-th could be
    # outranked past them (_pair_scores)
    knn(x, 3, x, True)  # own index left out of the search: k (+ 2), not k + 1 (+ 2)
    knn(x, 3, x.clone(), True)  # a separate reference: k + 1 (+ 2), then own index dropped
    assert calls == [(300, 300, 5)] * 2 + [(300, 300, 6)]
    knn(x[:299], 3)  # fewer pairs than the threshold
    knn(x.double(), 3)  # float64 keeps the PyTorch paths
    CustomKNN(LpDistance(), batch_size=50)(x, 3)  # so does a batch_size set by the user
    monkeypatch.setenv(_compiled_topk.DISABLE_ENV, "1")
    knn(x, 3)
    assert len(calls) == 3
    monkeypatch.delenv(_compiled_topk.DISABLE_ENV)
    asked = []
    monkeypatch.setattr(knn_module, "_compiled_loads", lambda pairs: asked.append(1) or True)
    CustomKNN(SNRDistance())(x, 3)  # no one-product scorer: numba is not even looked up
    assert len(calls) == 3 and not asked


def test_numba_loads_once_the_searches_of_the_process_pay_for_it(monkeypatch) -> None:
    """Searches add up their pairs until they reach COMPILED_LOAD_PAIRS; from then on,
    every search from COMPILED_MIN_PAIRS runs compiled."""
    calls = _spy_on_compiled_searches(monkeypatch)
    monkeypatch.setattr(_compiled_topk, "_used", False)
    monkeypatch.setattr(knn_module, "_cold_pairs", 0)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 100 * 100)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 3 * 200 * 200)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    x = torch.randn(200, 4)
    knn(x, 3)
    knn(x[:99], 3)  # below COMPILED_MIN_PAIRS: not counted
    knn(x, 3)
    assert calls == [] and not _compiled_topk.loaded()
    knn(x, 3)  # the third: 3 * 200 * 200 pairs in all (each searched two past k)
    assert calls == [(200, 200, 5)] and _compiled_topk.loaded()
    knn(x[:100], 3)
    knn(x[:99], 3)
    assert calls == [(200, 200, 5), (100, 100, 5)]


def test_searches_for_many_neighbours_count_twice_toward_loading_numba(monkeypatch) -> None:
    calls = _spy_on_compiled_searches(monkeypatch)
    monkeypatch.setattr(_compiled_topk, "_used", False)
    monkeypatch.setattr(knn_module, "_cold_pairs", 0)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 100 * 100)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 2 * 200 * 200)
    monkeypatch.setattr(knn_module, "LARGE_K", 10)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    x = torch.randn(200, 4)
    # a search for k looks two neighbours past it (see _pair_scores), so k = 8 searches
    # LARGE_K
    knn(x, 7)  # 200 * 200 pairs, counted once
    assert calls == [] and not _compiled_topk.loaded()
    monkeypatch.setattr(knn_module, "_cold_pairs", 0)
    knn(x, 8)  # counted twice: loads now
    assert calls == [(200, 200, 10)] and _compiled_topk.loaded()


def test_a_small_first_search_does_not_import_numba() -> None:
    code = (
        "import sys, torch\n"
        "from pytorch_metric_learning.distances import LpDistance\n"
        "from pytorch_metric_learning.evaluation import CustomKNN\n"
        "CustomKNN(LpDistance())(torch.randn(3000, 8), 5)  # above COMPILED_MIN_PAIRS\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_unavailable_numba_leaves_the_pytorch_paths(monkeypatch) -> None:
    monkeypatch.setattr(_compiled_topk, "_kernels", lambda: None)
    monkeypatch.setattr(_compiled_topk, "_used", False)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    assert not _compiled_topk.available()
    with pytest.raises(ModuleNotFoundError, match="numba"):
        _compiled_topk.CompiledTopK(3, 1)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    _, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 4)
    table = ((x[:, None, :] - x[None, :, :]) ** 2).sum(2).double().numpy()
    assert_top_k(np.take_along_axis(table, indices.numpy(), 1), indices.numpy(), table, 4)


@pytest.fixture
def reloaded_kernels():
    """``_kernels()`` looked up afresh in the test, and again by the tests after it."""
    _compiled_topk._kernels.cache_clear()
    yield
    _compiled_topk._kernels.cache_clear()


def _search_keeps_the_pytorch_paths(monkeypatch) -> None:
    monkeypatch.setattr(_compiled_topk, "_used", False)
    monkeypatch.setattr(knn_module, "COMPILED_LOAD_PAIRS", 0)
    monkeypatch.setattr(knn_module, "COMPILED_MIN_PAIRS", 0)
    calls = _spy_on_compiled_searches(monkeypatch)
    x = torch.randn(60, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, at the first lookup, not per search
        _, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 5)
    table = ((x[:, None, :] - x[None, :, :]) ** 2).sum(2).double().numpy()
    assert_top_k(np.take_along_axis(table, indices.numpy(), 1), indices.numpy(), table, 5)
    assert calls == [] and not _compiled_topk.loaded()


def test_loops_that_fail_to_load_warn_and_leave_the_pytorch_paths(
    monkeypatch, reloaded_kernels
) -> None:
    def broken(kernels):
        raise OSError("could not load libllvmlite.so")

    monkeypatch.setattr(_compiled_topk, "_try_out", broken)
    with pytest.warns(RuntimeWarning, match="could not be used .OSError: could not load libllvm"):
        assert not _compiled_topk.available()
    with pytest.raises(ModuleNotFoundError, match="numba"):
        _compiled_topk.CompiledTopK(3, 1)
    _search_keeps_the_pytorch_paths(monkeypatch)


def test_loops_that_fail_to_import_warn_when_numba_is_installed(
    monkeypatch, reloaded_kernels
) -> None:
    package = importlib.import_module("pytorch_metric_learning.evaluation.search")
    monkeypatch.delattr(package, "_topk_kernels", raising=False)
    monkeypatch.setitem(
        sys.modules, "pytorch_metric_learning.evaluation.search._topk_kernels", None
    )
    with pytest.warns(RuntimeWarning, match="PML_DISABLE_NUMBA=1"):
        assert _compiled_topk._kernels() is None
    _search_keeps_the_pytorch_paths(monkeypatch)


def test_no_warning_without_numba(monkeypatch, reloaded_kernels) -> None:
    package = importlib.import_module("pytorch_metric_learning.evaluation.search")
    monkeypatch.delattr(package, "_topk_kernels", raising=False)
    monkeypatch.setitem(
        sys.modules, "pytorch_metric_learning.evaluation.search._topk_kernels", None
    )
    monkeypatch.setattr(_compiled_topk.importlib.util, "find_spec", lambda name: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compiled_topk._kernels() is None


def _finish_off_by_one(real):
    def finish(*args):
        real.finish(*args)
        args[6][:, -1] += 1  # out_values

    return finish


def _kth_wrong_above_insertion(real):
    def kth_smallest_rows(tile, k, out, start, stop):
        real.kth_smallest_rows(tile, k, out, start, stop)
        if k > real.INSERTION_MAX_K:  # only the quickselect way is wrong
            out[start:stop] += 1

    return kth_smallest_rows


@pytest.mark.parametrize(
    ("name", "broken"),
    [("finish", _finish_off_by_one), ("kth_smallest_rows", _kth_wrong_above_insertion)],
)
def test_the_load_check_catches_loops_that_return_a_wrong_top_k(name, broken) -> None:
    real = _compiled_topk._kernels()
    names = ("BLOCK", "INSERTION_MAX_K", "push_rows", "push_columns", "push_both", "_radix_sort")
    loops = {other: getattr(real, other) for other in (*names, "finish", "kth_smallest_rows")}
    wrong = SimpleNamespace(**{**loops, name: broken(real)})
    with pytest.raises(RuntimeError, match="wrong top-k"):
        _compiled_topk._try_out(wrong)
    _compiled_topk._try_out(real)


def test_kth_smallest_refuses_a_rank_outside_the_row() -> None:
    state = _compiled_topk.CompiledTopK(2, 1)
    for k in (0, 4):
        with pytest.raises(ValueError, match="1 <= k <= 3"):
            state.kth_smallest(torch.zeros(2, 3), k)


def test_finish_releases_the_candidates_buffer_by_buffer(monkeypatch) -> None:
    monkeypatch.setattr(_compiled_topk, "ROWS_PER_BUFFER", 2)
    state = _compiled_topk.CompiledTopK(5, 1)
    released = []
    original = state._kernels.finish

    def spy(*args):
        released.append(sum(buffer is None for buffer in state._buffers))
        return original(*args)

    monkeypatch.setattr(state, "_kernels", type("K", (), {"finish": staticmethod(spy)}))
    state.count[:] = 0
    values, indices = state.finish()
    assert released == [0, 1, 2]  # each buffer is gone before the next one's rows are written
    assert values.shape == (5, 1) and bool((indices == -1).all())
    state._kernels = _compiled_topk._kernels()
    with pytest.raises(RuntimeError, match="finished"):
        state.push_rows(0, torch.zeros(1, 3), 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("buffer_rows", [3, 2048])
def test_finish_renames_candidates_before_sorting_and_places_rows(
    monkeypatch, buffer_rows, threads
) -> None:
    """Ties are ordered by the new names; row r lands at ``positions[r]``."""
    monkeypatch.setattr(_compiled_topk, "ROWS_PER_BUFFER", buffer_rows)
    monkeypatch.setattr(_compiled_topk, "MIN_PART", 1)  # split even a few rows over threads
    shift = 10.0 * torch.arange(7.0).unsqueeze(1)  # every row its own values
    scores = torch.tensor([[1.0, 0.0, 1.0, 1.0, 5.0]]) + shift
    scores[3] = torch.tensor([2.0, 2.0, 2.0, 2.0, 9.0]) + shift[3]  # ties only
    state = _compiled_topk.CompiledTopK(7, 4, threads=threads)
    state.push_rows(0, scores, 0)
    numbering = np.array([40, 30, 20, 10, 0], dtype=np.int32)
    positions = torch.tensor([6, 5, 4, 0, 2, 1, 3])  # source row 3 lands at row 0
    values, indices = state.finish(numbering, positions)
    for row, out_row in enumerate(positions.tolist()):
        if row == 3:
            assert indices[out_row].tolist() == [10, 20, 30, 40]
            assert values[out_row].tolist() == [32.0] * 4
        else:
            assert indices[out_row].tolist() == [30, 10, 20, 40]
            assert values[out_row].tolist() == [10.0 * row + v for v in (0.0, 1.0, 1.0, 1.0)]


def test_first_bounds_come_from_the_sample_tile(compiled_everywhere, monkeypatch) -> None:
    """The bound of each row is set once, from its first tile (the sample), before any
    candidate is offered to it; the result equals brute force."""
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(5))
    seen = []
    original = _compiled_topk.CompiledTopK.kth_smallest

    def spy(self, scores, k):
        seen.append((scores.shape, k, bool(np.isinf(self.bound).all())))
        return original(self, scores, k)

    monkeypatch.setattr(_compiled_topk.CompiledTopK, "kth_smallest", spy)
    values, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 3, None, True)
    # threads take the row blocks in any order: compare the tiles as a multiset
    assert sorted(tuple(shape) for shape, _, _ in seen) == [(8, 32)] + [(32, 32)] * 6
    assert seen[0][2]  # no bound before the first tile
    table = torch.cdist(x.double(), x.double()).numpy() ** 2
    np.fill_diagonal(table, np.inf)
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 3, False)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(
        st.one_of(
            st.integers(0, 2**64 - 1),
            st.sampled_from([0, 1, 255, 256, 2**32, 2**63, 2**64 - 1]),
        ),
        max_size=300,
    ),
    padding=st.integers(0, 5),
)
def test_radix_sort_equals_numpy_sort(keys, padding) -> None:
    """The finish loop's sort of (value, index) keys, with shared bytes, duplicates and
    slots past ``size`` that it must leave alone."""
    kernels = _compiled_topk._kernels()
    array = np.array(keys + [7] * padding, dtype=np.uint64)
    spare = np.empty(len(array), dtype=np.uint64)
    kernels._radix_sort(array, len(keys), spare, np.empty((8, 256), dtype=np.int64))
    assert array[: len(keys)].tolist() == sorted(keys)
    assert array[len(keys) :].tolist() == [7] * padding


@settings(max_examples=150, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 200)),
    levels=st.sampled_from([3, 1000, 2**24]),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_kth_smallest_rows_equals_sorting(shape, levels, seed, data) -> None:
    """Both ways (insertion for small k, bounded quickselect above), ties included."""
    rows, width = shape
    k = data.draw(st.integers(1, width))
    generator = torch.Generator().manual_seed(seed)
    tile = (torch.randint(0, levels, shape, generator=generator) - levels // 2).float().numpy()
    specials = np.array([np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    spots = data.draw(st.lists(st.tuples(st.integers(0, rows - 1), st.integers(0, width - 1))))
    for (row, column), special in zip(spots, np.resize(specials, len(spots))):
        tile[row, column] = special
    out = np.empty(rows, dtype=np.float32)
    _compiled_topk._kernels().kth_smallest_rows(tile, k, out, 0, rows)
    assert out.tolist() == np.sort(tile, axis=1)[:, k - 1].tolist()


# ----- threads: no wait can be a cycle (each bounded here, so a regression fails, named) -----


def _finishes(target, timeout=60.0):
    """Run ``target`` in a thread; fails instead of hanging if it does not return."""
    outcome = []

    def run():
        try:
            outcome.append(("value", target()))
        except BaseException as error:  # handed to the test's thread
            outcome.append(("error", error))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), f"{getattr(target, '__name__', target)} did not return"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def test_the_parts_have_all_ended_when_a_failing_first_part_raises() -> None:
    """A failure on the caller's thread is raised only once the pool's parts have ended:
    the caller then restores what it changed for them, and none outlives it."""
    started, ended = threading.Event(), []

    def work(part):
        if part == 0:
            assert started.wait(timeout=30)
            raise MemoryError("injected")
        started.set()
        threading.Event().wait(timeout=0.5)  # still running when part 0 raises
        ended.append(part)

    with pytest.raises(MemoryError, match="injected"):
        _finishes(lambda: _compiled_topk._in_parts(work, 2))
    assert ended == [1]


@pytest.mark.parametrize("outer_parts", [2, 3])
def test_parts_split_again_on_a_pool_thread_never_wait_for_the_pool(outer_parts) -> None:
    """A pool thread that splits its own work into parts runs them itself: waiting for
    tasks queued behind it on the pools would be waiting for itself."""
    done = []
    lock = threading.Lock()

    def inner(part):
        with lock:
            done.append(part)

    def outer(part):
        _compiled_topk._in_parts(inner, 2)

    _finishes(lambda: _compiled_topk._in_parts(outer, outer_parts))
    assert sorted(done) == [0] * outer_parts + [1] * outer_parts


@pytest.mark.parametrize("separate", [True, False])
def test_a_search_failing_on_the_callers_thread_leaves_the_next_search_free(
    compiled_everywhere, monkeypatch, separate
) -> None:
    """The CI stall: a walk failed on the caller's thread, its pool thread went on with
    the state's thread count restored, split its push over the pool it was the only
    thread of and waited for itself; every later threaded search waited for that pool."""
    x = torch.randn(150, 8, generator=torch.Generator().manual_seed(16))
    caller_failed = threading.Event()
    callers = []
    scorer = SeparateSquaredEuclidean if separate else SquaredEuclidean
    original_tile = scorer.tile

    def tile(self, rows, cols, out):
        if threading.get_ident() in callers:
            caller_failed.set()
            raise MemoryError("injected")
        if cols.start != 0:  # past the first tile: wait (bounded) until the caller failed
            caller_failed.wait(timeout=10)
        return original_tile(self, rows, cols, out)

    def failing_search():
        callers.append(threading.get_ident())
        CustomKNN(LpDistance(normalize_embeddings=False, power=2))(
            x, 6, x.clone() if separate else None
        )

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(scorer, "tile", tile)
        with pytest.raises(MemoryError, match="injected"):
            _finishes(failing_search)
        monkeypatch.setattr(scorer, "tile", original_tile)
        values, indices = _finishes(
            lambda: CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 6)
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    table = torch.cdist(x.double(), x.double()).numpy() ** 2
    _assert_near_top_k(values.numpy(), indices.numpy(), table, 6, False)


def test_many_threads_searching_at_once_each_get_their_own_answer(compiled_everywhere) -> None:
    """Python threads share the pools and PyTorch's thread counts: all finish, each with
    brute force's answer, and the caller's thread count is left as it was."""
    problems = []
    for seed in range(6):
        generator = torch.Generator().manual_seed(100 + seed)
        query = torch.randn(96 + 16 * seed, 6, generator=generator)
        reference = torch.randn(80, 6, generator=generator) if seed % 2 else None
        problems.append((query, reference))
    results = [None] * len(problems)
    errors = []

    def search(number):
        try:
            query, reference = problems[number]
            results[number] = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(
                query, 5, reference
            )
        except BaseException as error:
            errors.append(error)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runners = [threading.Thread(target=search, args=(n,), daemon=True) for n in range(6)]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(timeout=120)
        assert not any(runner.is_alive() for runner in runners), "a search did not return"
        assert not errors, errors
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    for (query, reference), (values, indices) in zip(problems, results):
        other = query if reference is None else reference
        table = torch.cdist(query.double(), other.double()).numpy() ** 2
        _assert_near_top_k(values.numpy(), indices.numpy(), table, 5, False)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_other_threads_search_can_search(compiled_everywhere) -> None:
    """A forked child has none of its parent's threads: not the pool's, nor one that held
    a lock of the thread counts when it forked; its own search finishes."""
    from pytorch_metric_learning import _threads

    _compiled_topk._in_parts(lambda part: None, 2)  # the parent's pool exists
    x = torch.randn(100, 6, generator=torch.Generator().manual_seed(17))
    with _threads._lock:  # held by "another thread" at the fork
        child = os.fork()
        if child == 0:  # pragma: no cover (the child reports through its exit code)
            code = 1
            try:
                torch.set_num_threads(1)  # OpenMP itself cannot start teams after a fork
                state = _compiled_topk.CompiledTopK(len(x), 3, threads=2)
                state.push_rows(0, x @ x.T, 0)
                with search_module._one_torch_thread():
                    pass
                with _threads.adapted_threads(_threads.MIN_PAIRS, torch.device("cpu")):
                    pass
                values, _ = state.finish()
                code = 0 if torch.equal(values, (x @ x.T).sort(dim=1).values[:, :3]) else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + 60
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        threading.Event().wait(timeout=0.05)
    if status[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child's search did not return")
    assert os.waitstatus_to_exitcode(status[1]) == 0
