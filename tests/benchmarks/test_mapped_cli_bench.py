"""Peak resident memory of ``pml-eval evaluate`` against a memory-mapped ``.npy`` gallery
(``benchmarks/mapped_cli.py``): it must not grow with the gallery file, float32 or float16.

Each child runs the command in a fresh process and reports its ``VmHWM`` (the peak resident
set, file pages of the mapping included). The growth of the peak between two gallery sizes,
both far above one search block, is what a whole copy of the gallery would show: a copy of
the float32 values adds at least the files' difference, a float16 file read whole adds its
own difference and a float32 conversion twice more. The fixed costs (torch, the search's
tile of distances, one block) are the same in both and cancel out. numba is kept out of
the children: whether a search loads it depends on how busy the cores are (see
``CustomKNN``), and its libraries add about 100 MiB that have nothing to do with the input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _peak import STEADY_THREADS

from ._scripts import load_script

QUERIES = 1_000
DIMS = 128
TINY, MID, BIG = 1_000, 100_000, 600_000
# rows per class: the k-NN metrics then need about as many neighbours at every size
CLASS_ROWS = 300


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_peak_memory_of_evaluate_does_not_grow_with_a_mapped_gallery(
    tmp_path: Path, dtype: str
) -> None:
    bench = load_script("mapped_cli")
    rng = np.random.default_rng(0)
    query = tmp_path / "q.npy"
    np.save(query, rng.standard_normal((QUERIES, DIMS)).astype(dtype))
    np.save(tmp_path / "ql.npy", rng.integers(0, 3, QUERIES))
    peaks, sizes = {}, {}
    for rows in (TINY, MID, BIG):
        path = bench.write_gallery(tmp_path, rows, DIMS, dtype, max(1, rows // CLASS_ROWS))
        sizes[rows] = path.stat().st_size / 2**20
        peaks[rows], _ = bench.peak_of_evaluate(
            tmp_path, query, rows, dtype, ("--metrics", "precision_at_1,r_precision"),
            PML_DISABLE_NUMBA="1", **STEADY_THREADS,
        )  # fmt: skip
    report = f"peaks {peaks} MiB, files {sizes} MiB"
    # streamed: a quarter of the files' difference leaves room for the labels (8 bytes a
    # row) and the allocator, and is far below the one difference a whole copy adds
    # (measured on a loaded 2-core machine: 13 MiB of 244 for float32, 15 of 122 for float16)
    assert peaks[BIG] - peaks[MID] < (sizes[BIG] - sizes[MID]) / 4, report
    # over the tiny gallery's peak: the search's fixed costs (its 62.5 MiB tile of
    # distances, one block, ...; measured 117 MiB), below what the file read whole would
    # add (float32: the file; float16: the file plus its float32 copy, twice the file)
    most = 0.75 if dtype == "float32" else 1.5
    assert peaks[BIG] - peaks[TINY] < most * sizes[BIG], report
