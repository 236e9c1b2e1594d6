"""AccuracyCalculator speed, peak memory and agreement against pytorch-metric-learning 2.9.0.

Run through nox, which builds the two environments (2.9.0 has this project's import name,
so it lives in a virtualenv of its own and runs here as a subprocess):

    nox -s bench_pml29                      # n = 20k, 50k, 100k; 100, 1000, 2000 classes
    nox -R -s bench_pml29 -- --sizes 20000 --classes 100  # reuse the environments

Data: class-clustered synthetic embeddings (d = 128, ``--classes`` classes), one
self-retrieval evaluation (``get_accuracy(x, labels)``), written once to temporary .npy
files that both sides read. Every measurement runs in a fresh subprocess, and its peak
memory is that process's own peak resident set (``_memory.py``) (which sees torch's allocations, unlike
tracemalloc), reported in full and as the growth over the process's peak just before
``get_accuracy`` (imports and data). Sides:

  ours          AccuracyCalculator() defaults: CustomKNN + TorchKMeans, 5 metrics
  pml29         2.9.0 with k="max_bin_count" (its advice for large sets): FaissKNN,
                FaissKMeans(niter=20), all 7 metrics (it computes MAP and MRR by default)

"max |diff| kNN" compares the k-NN metrics both sides computed (each with its own exact
search, so near-ties may order differently); NMI and AMI differ by the k-means each side
runs and are shown separately. "same inputs" then gives both sides the same neighbours
and clusters (computed once by this project's CustomKNN and TorchKMeans, saved next to
the data) and compares all seven metrics: only the metric code differs there.
Times are wall-clock and CPU (user + system) seconds of ``get_accuracy``; the CPU ratio
is steadier when other processes share the cores. Each process calls ``get_accuracy``
``--calls`` times on the same data, as a training loop does every epoch: "first" is the
first call (with whatever each side loads in it: numba's compiled loops here, faiss's
threads there), "later" the best of the others. "cold" adds to the first call the import
of the library (torch and numpy are imported already) and the calculator's construction:
2.9.0 imports faiss and scikit-learn when it is imported, while this project loads numba
in its first large search, so only "cold" counts each side's once-per-process loading,
wherever it is paid. Each side runs ``--repeats``
processes, the sides taking turns, and the best time of each is kept (the machine may be
shared); the ratio is 2.9.0's best over ours (above 1: ours is faster). The same-inputs
check runs for the first class count of each size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _memory import peak_rss_bytes

KNN_KEYS = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
)
ALL_METRICS = (*KNN_KEYS, "NMI", "AMI")


def make_data(n: int, dims: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes: a random centre per class plus isotropic noise of the same scale."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    centers = rng.standard_normal((num_classes, dims)).astype(np.float32)
    noise = rng.standard_normal((n, dims)).astype(np.float32)
    return centers[labels] + 1.4 * noise, labels.astype(np.int64)


def peak_mb() -> float:
    return peak_rss_bytes() / 2**20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker(side: str, data_dir: str, k: str, calls: int) -> None:
    """Run ``calls`` evaluations in this process and print a JSON line with their times,
    the peak memory and the metrics."""
    import torch

    x = torch.from_numpy(np.load(os.path.join(data_dir, "x.npy")))
    labels = torch.from_numpy(np.load(os.path.join(data_dir, "labels.npy")))
    if side == "neighbours":
        save_shared_inputs(x, labels, data_dir)
        return
    options: dict = {"k": None if k == "none" else k}
    if side.endswith("_same"):
        options.update(shared_inputs(data_dir), k="max_bin_count", include=ALL_METRICS)
    setup_cpu, setup_start = cpu_seconds(), time.perf_counter()
    if side.startswith("ours"):
        from pytorch_metric_learning.evaluation import AccuracyCalculator
    else:
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        options["device"] = torch.device("cpu")
    calculator = AccuracyCalculator(**options)
    setup = (time.perf_counter() - setup_start, cpu_seconds() - setup_cpu)
    before = peak_mb()
    seconds, cpus = [], []
    for _ in range(calls):
        cpu, start = cpu_seconds(), time.perf_counter()
        results = calculator.get_accuracy(x, labels)
        seconds.append(time.perf_counter() - start)
        cpus.append(cpu_seconds() - cpu)
    after = peak_mb()
    metrics = {key: float(value) for key, value in results.items()}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu": cpus,
                "setup_seconds": setup[0],
                "setup_cpu": setup[1],
                "peak_mb": after,
                "growth_mb": after - before,
                "metrics": metrics,
            }
        )
    )


def save_shared_inputs(x, labels, data_dir: str) -> None:
    """Neighbours (as many as 2.9.0's k="max_bin_count" asks for) and k-means clusters."""
    import torch

    from pytorch_metric_learning.evaluation import AccuracyCalculator, TorchKMeans

    k = int(torch.bincount(labels).max()) - 1
    distances, indices = AccuracyCalculator().knn_func(x, k, x, True)
    np.save(os.path.join(data_dir, "knn_distances.npy"), distances.numpy())
    np.save(os.path.join(data_dir, "knn_indices.npy"), indices.numpy())
    clusters = TorchKMeans()(x, len(torch.unique(labels)))
    np.save(os.path.join(data_dir, "clusters.npy"), clusters.numpy())


def shared_inputs(data_dir: str) -> dict:
    """knn_func and kmeans_func that return the saved neighbours and clusters."""
    import torch

    distances = torch.from_numpy(np.load(os.path.join(data_dir, "knn_distances.npy")))
    indices = torch.from_numpy(np.load(os.path.join(data_dir, "knn_indices.npy")))
    clusters = torch.from_numpy(np.load(os.path.join(data_dir, "clusters.npy")))

    def knn_func(query, k, reference=None, ref_includes_query=False):
        return distances[:, :k], indices[:, :k]

    def kmeans_func(x, num_clusters):
        return clusters

    return {"knn_func": knn_func, "kmeans_func": kmeans_func}


def measure(python: str, side: str, data_dir: str, k: str, calls: int = 1) -> dict:
    command = [python, os.path.abspath(__file__), "--worker", side, "--data", data_dir]
    command += ["--k", k, "--calls", str(calls)]
    env = dict(os.environ)
    if side.startswith("pml29"):  # 2.9.0 has our import name: never let it see our path
        env.pop("PYTHONPATH", None)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def best_of(runs: list[dict]) -> dict:
    """The smallest first-call, cold (setup and first call) and later-call times, CPU
    times and peaks of all runs, with the metrics of the run with the fastest first call."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]
    best = dict(min(good, key=lambda run: run["seconds"][0]))
    for key in ("seconds", "cpu"):
        best[f"first_{key}"] = min(run[key][0] for run in good)
        later = [value for run in good for value in run[key][1:]]
        best[f"later_{key}"] = min(later) if later else None
        best[f"cold_{key}"] = min(run[f"setup_{key}"] + run[key][0] for run in good)
    for key in ("peak_mb", "growth_mb"):
        best[key] = min(run[key] for run in good)
    return best


def measure_sides(
    sides: dict[str, tuple[str, str]], data_dir: str, repeats: int, calls: int
) -> dict:
    """``{name: best run}`` of each side ``name: (python, k)``, the sides taking turns."""
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, (python, k) in sides.items():
            side = "ours" if name == "ours" else "pml29"
            runs[name].append(measure(python, side, data_dir, k, calls))
    return {name: best_of(found) for name, found in runs.items()}


def max_difference(first: dict, second: dict, keys: tuple[str, ...]) -> float:
    shared = [key for key in keys if key in first["metrics"] and key in second["metrics"]]
    return max(
        (abs(first["metrics"][key] - second["metrics"][key]) for key in shared),
        default=float("nan"),
    )


def row(n: int, classes: int, label: str, ours: dict, other: dict | None) -> str:
    head = f"{n:>7} {classes:>5} cl {label:<6}"
    if other is None or "error" in other:
        reason = "" if other is None else f"  ({label}: {other['error']})"
        return (
            f"{head} ours first {ours['first_seconds']:7.2f} s (cpu {ours['first_cpu']:.1f} s)"
            f"{_later(ours)} {ours['peak_mb']:7.0f} MB (+{ours['growth_mb']:.0f}){reason}"
        )
    timings = " | ".join(
        f"{when} {ours[f'{when}_seconds']:6.2f} vs {other[f'{when}_seconds']:6.2f} s "
        f"x{other[f'{when}_seconds'] / ours[f'{when}_seconds']:5.2f} (cpu "
        f"x{other[f'{when}_cpu'] / ours[f'{when}_cpu']:5.2f})"
        for when in ("first", "cold", "later")
        if ours[f"{when}_seconds"] is not None and other[f"{when}_seconds"] is not None
    )
    return (
        f"{head} {timings} | peak {ours['peak_mb']:5.0f} vs {other['peak_mb']:5.0f} MB "
        f"(+{ours['growth_mb']:.0f} vs +{other['growth_mb']:.0f}) "
        f"| max|diff| kNN {max_difference(ours, other, KNN_KEYS):.1e} "
        f"NMI/AMI {max_difference(ours, other, ('NMI', 'AMI')):.1e}"
    )


def _later(run: dict) -> str:
    if run["later_seconds"] is None:
        return ""
    return f", later {run['later_seconds']:7.2f} s (cpu {run['later_cpu']:.1f} s)"


def same_inputs_row(n: int, ours: dict, other: dict) -> str:
    if "error" in ours or "error" in other:
        return f"{n:>7} same inputs: failed ({ours.get('error') or other.get('error')})"
    each = ", ".join(f"{key} {max_difference(ours, other, (key,)):.0e}" for key in ALL_METRICS)
    return f"{n:>7} same inputs, |diff|: {each}"


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.data, args.k, args.calls)
        return
    print(
        f"d={args.dims}, self-retrieval, best of {args.repeats} processes of {args.calls} "
        f"calls; cores: {os.cpu_count()}",
        flush=True,
    )
    records = []
    for n in args.sizes:
        for index, classes in enumerate(args.classes):
            with tempfile.TemporaryDirectory() as data_dir:
                record = run_case(args, n, classes, data_dir, same_inputs=index == 0)
            records.append(record)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))


def run_case(args: argparse.Namespace, n: int, classes: int, data_dir: str, same_inputs: bool):
    """Measure one (n, classes) case; print its rows and return its record."""
    x, labels = make_data(n, args.dims, classes, args.seed)
    np.save(os.path.join(data_dir, "x.npy"), x)
    np.save(os.path.join(data_dir, "labels.npy"), labels)
    del x, labels
    sides = {"ours": (sys.executable, "none")}
    if args.pml29_python:
        sides["pml29"] = (args.pml29_python, "max_bin_count")
    measured = measure_sides(sides, data_dir, args.repeats, args.calls)
    record: dict = {"n": n, "classes": classes, **measured}
    if "error" in record["ours"]:
        print(f"{n:>7} {classes:>5} cl ours failed: {record['ours']['error']}", flush=True)
        return record
    print(
        row(n, classes, "pml29" if args.pml29_python else "", record["ours"], record.get("pml29")),
        flush=True,
    )
    if args.pml29_python and same_inputs and not args.no_same_inputs:
        measure(sys.executable, "neighbours", data_dir, "none")
        record["ours_same"] = measure(sys.executable, "ours_same", data_dir, "none")
        record["pml29_same"] = measure(args.pml29_python, "pml29_same", data_dir, "none")
        print(same_inputs_row(n, record["ours_same"], record["pml29_same"]), flush=True)
    return record


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 50_000, 100_000])
    parser.add_argument("--classes", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--calls", type=int, default=3, help="get_accuracy calls per process (every epoch)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pml29-python", help="python of a virtualenv with 2.9.0 (nox makes one)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--no-same-inputs", action="store_true", help="skip the same-inputs check")
    parser.add_argument(
        "--worker",
        choices=["ours", "pml29", "neighbours", "ours_same", "pml29_same"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--k", default="none", help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    main()
