"""Peak resident memory of ``pml-eval evaluate`` against a memory-mapped ``.npy`` gallery.

Writes a gallery of ``--rows`` x ``--dims`` random rows (block by block) as float32 and
float16 files, and runs ``pml-eval evaluate`` of ``--queries`` queries against each in a
fresh process, default metrics, ``--classes`` classes. Each child prints its ``VmHWM``
(the peak resident set, the mapping's file pages included). A gallery of 1,000 rows gives
the process's baseline (torch and the CLI imported, a search run). Linux only (``/proc``).

    python benchmarks/mapped_cli.py                       # 1,000 x 1,000,000 x 128
    python benchmarks/mapped_cli.py --rows 300000 --dtypes float16

Wall times on a shared machine swing with its load; the peaks do not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BASELINE_ROWS = 1_000

CHILD = """
import sys
from pytorch_metric_learning.cli import main
code = main(sys.argv[1:])
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print("PEAK_KIB", peak[0].split()[1], file=sys.stderr)
sys.exit(code)
"""


def write_gallery(folder: Path, rows: int, dims: int, dtype: str, classes: int) -> Path:
    """``g{rows}_{dtype}.npy`` of standard normal rows, written 100,000 rows at a time, and
    its labels ``gl{rows}.npy`` (``classes`` classes)."""
    rng = np.random.default_rng(rows)
    path = folder / f"g{rows}_{dtype}.npy"
    gallery = np.lib.format.open_memmap(path, "w+", dtype, (rows, dims))
    for start in range(0, rows, 100_000):
        stop = min(start + 100_000, rows)
        gallery[start:stop] = rng.standard_normal((stop - start, dims)).astype(dtype)
    gallery.flush()
    del gallery
    np.save(folder / f"gl{rows}.npy", rng.integers(0, classes, rows))
    return path


def peak_of_evaluate(
    folder: Path, query: Path, rows: int, dtype: str, options: tuple[str, ...] = (), **env: str
) -> tuple[float, float]:
    """``(peak MiB, seconds)`` of one ``pml-eval evaluate`` in a fresh process, with more
    ``options`` and environment variables ``env``."""
    argv = [
        "evaluate", query, "--labels", folder / "ql.npy",
        "--reference", folder / f"g{rows}_{dtype}.npy",
        "--reference-labels", folder / f"gl{rows}.npy", *options,
    ]  # fmt: skip
    start = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PML_DISABLE_PROGRESS": "1", **env},
        timeout=3600,
    )
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"pml-eval evaluate failed: {completed.stderr}")
    line = [x for x in completed.stderr.splitlines() if x.startswith("PEAK_KIB")][-1]
    return int(line.split()[1]) / 1024, seconds


def run(args: argparse.Namespace, folder: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(folder / "ql.npy", rng.integers(0, args.classes, args.queries))
    queries = rng.standard_normal((args.queries, args.dims))
    print("| file | rows | file MiB | peak MiB | baseline MiB | peak - baseline | time s |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in args.dtypes:
        query = folder / f"q_{dtype}.npy"
        np.save(query, queries.astype(dtype))
        write_gallery(folder, BASELINE_ROWS, args.dims, dtype, args.classes)
        base, _ = peak_of_evaluate(folder, query, BASELINE_ROWS, dtype)
        path = write_gallery(folder, args.rows, args.dims, dtype, args.classes)
        peak, seconds = peak_of_evaluate(folder, query, args.rows, dtype)
        size = path.stat().st_size / 2**20
        print(
            f"| {dtype} | {args.rows:,} | {size:.0f} | {peak:.0f} | {base:.0f} | "
            f"{peak - base:.0f} | {seconds:.1f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1_000)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("--folder", type=Path, help="for the files (default: a temporary one)")
    args = parser.parse_args()
    if args.folder is not None:
        args.folder.mkdir(parents=True, exist_ok=True)
        run(args, args.folder)
        return
    with tempfile.TemporaryDirectory() as folder:
        run(args, Path(folder))


if __name__ == "__main__":
    main()
