"""Peak resident memory of ``pml-eval evaluate`` against a memory-mapped ``.npy`` gallery:
it must not grow with the gallery file (float32 or float16), measured in fresh processes.

Each child runs the command in-process and prints its ``VmHWM`` (the peak resident set,
file pages of the mapping included). The growth of the peak between two gallery sizes,
both far above one search block, is what a whole copy of the gallery would show: a copy of
the float32 values adds at least the files' difference, a float16 file read whole adds its
own difference and a float32 conversion twice more. The fixed costs (torch, the search's
tile of distances, one block) are the same in both and cancel out. numba is kept out of
the children: whether a search loads it depends on how busy the cores are (see
``CustomKNN``), and its libraries add about 100 MiB that have nothing to do with the input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

QUERIES = 1_000
DIMS = 128
TINY, MID, BIG = 1_000, 100_000, 600_000
# rows per class: the k-NN metrics then need about as many neighbours at every size
CLASS_ROWS = 300

_CHILD = """
import sys
from pytorch_metric_learning.cli import main
code = main(sys.argv[1:])
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print("PEAK_KIB", peak[0].split()[1], file=sys.stderr)
sys.exit(code)
"""


def _write_gallery(folder: Path, rows: int, dtype: type) -> tuple[Path, Path]:
    """A ``rows x DIMS`` gallery written block by block (never whole in this process)."""
    rng = np.random.default_rng(rows)
    path = folder / f"g{rows}.npy"
    gallery = np.lib.format.open_memmap(path, "w+", dtype, (rows, DIMS))
    for start in range(0, rows, 50_000):
        stop = min(start + 50_000, rows)
        gallery[start:stop] = rng.standard_normal((stop - start, DIMS)).astype(dtype)
    gallery.flush()
    del gallery
    labels = folder / f"gl{rows}.npy"
    np.save(labels, np.arange(rows) % max(1, rows // CLASS_ROWS))
    return path, labels


def _peak_mib(folder: Path, query: Path, gallery: tuple[Path, Path]) -> float:
    argv = [
        "evaluate", query, "--labels", folder / "ql.npy", "--reference", gallery[0],
        "--reference-labels", gallery[1], "--metrics", "precision_at_1,r_precision",
    ]  # fmt: skip
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, *map(str, argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PML_DISABLE_NUMBA": "1", "PML_DISABLE_PROGRESS": "1"},
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    line = [x for x in completed.stderr.splitlines() if x.startswith("PEAK_KIB")][-1]
    return int(line.split()[1]) / 1024


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_peak_memory_of_evaluate_does_not_grow_with_a_mapped_gallery(
    tmp_path: Path, dtype: type
) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.standard_normal((QUERIES, DIMS)).astype(dtype))
    np.save(tmp_path / "ql.npy", rng.integers(0, 3, QUERIES))
    peaks, sizes = {}, {}
    for rows in (TINY, MID, BIG):
        gallery = _write_gallery(tmp_path, rows, dtype)
        sizes[rows] = gallery[0].stat().st_size / 2**20
        peaks[rows] = _peak_mib(tmp_path, tmp_path / "q.npy", gallery)
    report = f"peaks {peaks} MiB, files {sizes} MiB"
    # streamed: a quarter of the files' difference leaves room for the labels (8 bytes a
    # row) and the allocator, and is far below the one difference a whole copy adds
    # (measured on a loaded 2-core machine: 13 MiB of 244 for float32, 15 of 122 for float16)
    assert peaks[BIG] - peaks[MID] < (sizes[BIG] - sizes[MID]) / 4, report
    # over the tiny gallery's peak: the search's fixed costs (its 62.5 MiB tile of
    # distances, one block, ...; measured 117 MiB), below what the file read whole would
    # add (float32: the file; float16: the file plus its float32 copy, twice the file)
    most = 0.75 if dtype is np.float32 else 1.5
    assert peaks[BIG] - peaks[TINY] < most * sizes[BIG], report
