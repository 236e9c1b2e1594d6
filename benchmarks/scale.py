"""How AccuracyCalculator's time and peak memory grow with the number of rows.

    python benchmarks/scale.py                     # n = 20k, 50k, 100k, 200k; 100 and 1,000
                                                   # classes; 10,000 queries x 1,000,000 rows
    python benchmarks/scale.py --quick             # n = 20k and 50k, 100 classes, no gallery
    python benchmarks/scale.py --sizes 20000 50000 --classes 1000 --gallery 0
    python benchmarks/scale.py --plot docs/scale.png --json scale.json

Data: the class-clustered embeddings of benchmarks/accuracy.py (d = 128), written once per
case, in blocks of rows, to a temporary ``.npy`` file that the measuring process reads
whole. Every case is measured in a fresh subprocess running the default
``AccuracyCalculator()`` (CustomKNN, TorchKMeans; precision_at_1, r_precision,
mean_average_precision_at_r, NMI, AMI): a self-search (``get_accuracy(x, labels)``) for
each size and class count, and with ``--gallery`` one search of ``--gallery-queries``
queries against a separate gallery of that many rows (k-NN metrics only: the clustering
metrics are of the query alone).

Printed per case: wall time of ``get_accuracy``, query-reference pairs per second, the
process's own peak resident memory (``VmHWM``, see ``_memory.py``), its growth over the
process after imports (``peak - base``), the inputs' size (embeddings and labels),
whether that growth stays within the inputs plus ``--budget-mib`` (512 MiB), and
``t/pair vs 50k``: the time per pair over the 50,000-row self-search's with the same
classes (``--gallery-classes``, 1,000, for the gallery search: with 100 classes each query
of a million-row gallery has about 10,000 relevant rows, all of them retrieved). The closing line quotes the ratio at the
largest size. The times are of one process each (``--repeats`` for the best of several).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _memory import peak_rss_bytes

MIB = 2**20
BLOCK_ROWS = 65_536
REFERENCE_ROWS = 50_000
QUICK_SIZES = [20_000, 50_000]


def peak_bytes() -> int:
    return peak_rss_bytes()


def write_data(
    path: Path, rows: int, dims: int, num_classes: int, seed: int, noise: float = 1.4
) -> None:
    """Class-clustered embeddings and labels as ``x.npy`` and ``labels.npy`` in ``path``,
    written in blocks so that the parent process never holds them whole; ``noise`` is the
    scale of each row's noise around its class centre (both standard normal)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((num_classes, dims)).astype(np.float32)
    x = np.lib.format.open_memmap(path / "x.npy", "w+", np.float32, (rows, dims))
    labels = np.lib.format.open_memmap(path / "labels.npy", "w+", np.int64, (rows,))
    for start in range(0, rows, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, rows)
        block = rng.integers(0, num_classes, stop - start)
        scatter = rng.standard_normal((stop - start, dims)).astype(np.float32)
        x[start:stop] = centers[block] + noise * scatter
        labels[start:stop] = block
    x.flush()
    labels.flush()
    del x, labels


def worker(data: str, queries: int) -> None:
    """One measurement: read the inputs, call ``get_accuracy`` once, print a JSON line."""
    import torch

    from pytorch_metric_learning.evaluation import AccuracyCalculator

    calculator = AccuracyCalculator()
    base = peak_bytes()
    x = torch.from_numpy(np.load(os.path.join(data, "x.npy")))
    labels = torch.from_numpy(np.load(os.path.join(data, "labels.npy")))
    inputs = x.nbytes + labels.nbytes
    start = time.perf_counter()
    if queries:
        knn_metrics = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
        metrics = calculator.get_accuracy(
            x[:queries], labels[:queries], x[queries:], labels[queries:], include=knn_metrics
        )
        pairs = queries * (len(x) - queries)
    else:
        metrics = calculator.get_accuracy(x, labels)
        pairs = len(x) * (len(x) - 1)
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "pairs": pairs,
        "peak": peak_bytes(),
        "base": base,
        "inputs": inputs,
        "metrics": {key: float(value) for key, value in metrics.items()},
    }
    print(json.dumps(result))


def measure(data: Path, queries: int, repeats: int) -> dict:
    """The best of ``repeats`` fresh processes (their stderr, a progress bar, passes through)."""
    runs = []
    for _ in range(repeats):
        command = [sys.executable, os.path.abspath(__file__), "--worker", str(data)]
        command += ["--worker-queries", str(queries)]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"error": f"exit status {done.returncode}"}
        runs.append(json.loads(lines[-1]))
    best = min(runs, key=lambda run: run["seconds"])
    best["peak"] = min(run["peak"] for run in runs)
    return best


def run_case(args: argparse.Namespace, rows: int, classes: int, queries: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        write_data(Path(folder), rows, args.dims, classes, args.seed)
        found = measure(Path(folder), queries, args.repeats)
    return {"rows": rows, "classes": classes, "queries": queries, **found}


def ratio_to_reference(record: dict, records: list[dict]) -> float | None:
    """Time per pair over that of the 50k self-search with the same classes, or None
    without one."""
    classes = record["classes"]
    for other in records:
        if other["rows"] == REFERENCE_ROWS and not other["queries"] and other["classes"] == classes:
            if "error" in other or "error" in record:
                return None
            return (record["seconds"] / record["pairs"]) / (other["seconds"] / other["pairs"])
    return None


HEADER = (
    "| case | classes | pairs | time s | pairs/s | peak MiB | peak - base MiB | inputs MiB "
    "| within inputs + budget | t/pair vs 50k |\n"
    "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | ---: |"
)


def table_row(record: dict, records: list[dict], budget: int) -> str:
    case = (
        f"{record['queries']:,} x {record['rows'] - record['queries']:,}"
        if record["queries"]
        else f"self {record['rows']:,}"
    )
    if "error" in record:
        return f"| {case} | {record['classes']} | | failed: {record['error']} | | | | | | |"
    growth = record["peak"] - record["base"]
    ratio = ratio_to_reference(record, records)
    within = "yes" if growth <= record["inputs"] + budget * MIB else "no"
    return (
        f"| {case} | {record['classes']} | {record['pairs']:.3g} | {record['seconds']:.1f} "
        f"| {record['pairs'] / record['seconds']:.3g} | {record['peak'] / MIB:.0f} "
        f"| {growth / MIB:.0f} | {record['inputs'] / MIB:.0f} | {within} "
        f"| {'' if ratio is None else f'{ratio:.2f}'} |"
    )


def plot(records: list[dict], path: str) -> None:
    """Seconds and peak growth against pairs, one line per class count (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    good = sorted((r for r in records if "error" not in r), key=lambda r: r["pairs"])
    figure, (times, memory) = plt.subplots(1, 2, figsize=(10, 4.2))
    for classes in sorted({record["classes"] for record in good if not record["queries"]}):
        line = [r for r in good if r["classes"] == classes and not r["queries"]]
        pairs = [r["pairs"] for r in line]
        label = f"self-search, {classes} classes"
        (drawn,) = times.plot(pairs, [r["seconds"] for r in line], "o-", label=label)
        growth = [(r["peak"] - r["base"]) / MIB for r in line]
        memory.plot(pairs, growth, "o-", label=label, color=drawn.get_color())
        budget = [r["inputs"] / MIB + 512 for r in line]
        memory.plot(pairs, budget, ":", color=drawn.get_color())
    for r in (r for r in good if r["queries"]):
        label = f"{r['queries']:,} x {r['rows'] - r['queries']:,}, {r['classes']} classes"
        (drawn,) = times.plot([r["pairs"]], [r["seconds"]], "s", label=label)
        color = drawn.get_color()
        memory.plot([r["pairs"]], [(r["peak"] - r["base"]) / MIB], "s", label=label, color=color)
        memory.plot([r["pairs"]], [r["inputs"] / MIB + 512], "_", markersize=14, color=color)
    times.set(xscale="log", yscale="log", xlabel="query-reference pairs", ylabel="seconds")
    memory.set(xscale="log", xlabel="query-reference pairs", ylabel="peak growth (MiB)")
    memory.set_ylim(bottom=0)
    for axes in (times, memory):
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.grid(True, which="major", alpha=0.3)
    times.set_title("wall time of get_accuracy (one process each)", fontsize=9)
    memory.set_title("peak growth; dotted / bar: inputs + 512 MiB (the goal)", fontsize=9)
    times.legend(fontsize=8, loc="upper left")
    memory.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.worker_queries)
        return
    if args.from_json:
        report(
            [record for name in args.from_json for record in json.loads(Path(name).read_text())],
            args,
        )
        return
    sizes = QUICK_SIZES if args.quick and not args.sizes else args.sizes or [20_000, 50_000]
    if not args.quick and not args.sizes:
        sizes = [20_000, 50_000, 100_000, 200_000]
    classes = [100] if args.quick and not args.classes else args.classes or [100, 1000]
    gallery = 0 if args.quick and args.gallery is None else args.gallery
    gallery = 1_000_000 if gallery is None else gallery
    print(f"d={args.dims}, default AccuracyCalculator, cores: {os.cpu_count()}", flush=True)
    print(HEADER, flush=True)
    records: list[dict] = []
    cases = [(rows, count, 0) for count in classes for rows in sizes]
    if gallery:
        cases.append((gallery + args.gallery_queries, args.gallery_classes, args.gallery_queries))
    for rows, count, queries in cases:
        records.append(run_case(args, rows, count, queries))
        print(table_row(records[-1], records, args.budget_mib), flush=True)
    print(closing_note(records), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))
    if args.plot:
        plot(records, args.plot)


def report(records: list[dict], args: argparse.Namespace) -> None:
    """The table, closing note and plot of measurements saved with ``--json``."""
    print(HEADER)
    for record in records:
        print(table_row(record, records, args.budget_mib))
    print(closing_note(records))
    if args.plot:
        plot(records, args.plot)


def closing_note(records: list[dict]) -> str:
    largest = max((r for r in records if "error" not in r), key=lambda r: r["pairs"], default=None)
    if largest is None:
        return "every case failed"
    ratio = ratio_to_reference(largest, records)
    quoted = "no 50k row to compare" if ratio is None else f"{ratio:.2f}x the 50k row's"
    return f"time per pair at the largest case ({largest['pairs']:.3g} pairs): {quoted}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="self-search rows")
    parser.add_argument("--classes", type=int, nargs="+", help="class counts (100 1000)")
    parser.add_argument("--gallery", type=int, help="gallery rows (1000000; 0: none)")
    parser.add_argument("--gallery-queries", type=int, default=10_000)
    parser.add_argument("--gallery-classes", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="20k and 50k, 100 classes")
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-mib", type=int, default=512)
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--plot", help="draw time and memory against pairs into this PNG")
    parser.add_argument("--from-json", nargs="+", help="report saved --json files; no run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-queries", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    main()
