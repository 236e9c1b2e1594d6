"""recall_at_K, time and peak memory against Open Metric Learning's cmc@K, on the same data.

Run through nox, which installs open-metric-learning 4.0.0 in a virtualenv of its own
(never the project's) next to this project, and pytorch-metric-learning 2.9.0 in a second
one, as ``bench_pml29`` does:

    nox -s bench_oml                          # n = 20k and 50k, 100 classes
    nox -R -s bench_oml -- --sizes 20000      # reuse the environments

Data: the class-clustered embeddings of benchmarks/scale.py (d = 128, ``--classes``
classes) with noise of scale ``--noise`` = 2.5 around the centres (scale.py's 1.4 gives a
recall near 1 at every K, which would check little), written once per size to temporary .npy files that every side reads whole. One
self-retrieval evaluation per side, each in a fresh subprocess:

  ours   AccuracyCalculator(include=("recall_at_1", "recall_at_5", "recall_at_10"))
         .get_accuracy(x, labels): CustomKNN, the query's own row left out
  oml    OML's own pipeline for embeddings: ``oml.functional.knn.batched_knn`` (torch.cdist
         in blocks of 5,000 queries, each item's own row left out, top 10) and
         ``oml.functional.metrics.calc_retrieval_metrics(cmc_top_k=(1, 5, 10))``
  pml29  (with ``--pml29-python``) 2.9.0's AccuracyCalculator, as benchmarks/accuracy.py
         runs it (its default metrics, k="max_bin_count"), against ours on its defaults:
         the ratios of bench_pml29 on this data, printed in the same table

The script asserts that recall_at_K equals OML's cmc@K to 1e-6 for every K. Peak memory is
each process's own peak resident set (``_memory.py``) and its growth over the process after imports and data. The
ratios are the other side's over ours (above 1: ours is faster or smaller).

OML is imported without running the ``__init__`` of the ``oml`` and ``oml.utils``
packages: they import its mock-dataset downloaders (gdown, pandas, torchvision,
albumentations, opencv), which its metric code does not use and whose torchvision pin
would pull a CUDA build of torch. The metric code needs torch, numpy, tqdm, matplotlib and
omegaconf only, which nox installs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import peak_rss_bytes
from scale import write_data  # noqa: E402

KS = (1, 5, 10)
TOLERANCE = 1e-6
MIB = 2**20


def peak_bytes() -> int:
    return peak_rss_bytes()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def import_oml_metrics() -> tuple:
    """OML's ``batched_knn`` and ``calc_retrieval_metrics``, without the package
    ``__init__`` files that import its dataset downloaders (see the module's notes).

    This script's folder leaves ``sys.path`` first: its name would hide the package."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.util.find_spec("oml")  # the package, not this script (oml.py)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("open-metric-learning is not installed (run: nox -s bench_oml)")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (("oml", root), ("oml.utils", root / "utils")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    from oml.functional.knn import batched_knn
    from oml.functional.metrics import calc_retrieval_metrics

    return batched_knn, calc_retrieval_metrics


def worker(side: str, data: str) -> None:
    """One evaluation in this process; prints a JSON line."""
    import torch

    search = None
    if side == "oml":
        search = import_oml_metrics()
    else:
        from pytorch_metric_learning.evaluation import AccuracyCalculator
    base = peak_bytes()
    x = torch.from_numpy(np.load(os.path.join(data, "x.npy")))
    labels = torch.from_numpy(np.load(os.path.join(data, "labels.npy")))
    cpu, start = cpu_seconds(), time.perf_counter()
    if search is not None:
        batched_knn, calc_retrieval_metrics = search
        ids = torch.arange(len(x))
        _, retrieved, relevant = batched_knn(x, ids, ids, max(KS), labels_gt=labels)
        found = calc_retrieval_metrics(
            retrieved, relevant, cmc_top_k=KS, precision_top_k=(), map_top_k=(), verbose=False
        )
        metrics = {f"recall_at_{k}": float(found["cmc"][k]) for k in KS}
    else:
        calculator = AccuracyCalculator(include=tuple(f"recall_at_{k}" for k in KS))
        metrics = {key: float(value) for key, value in calculator.get_accuracy(x, labels).items()}
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print(
        json.dumps(
            {"seconds": seconds, "cpu": cpu, "peak": peak_bytes(), "base": base, "metrics": metrics}
        )
    )


def measure(side: str, data: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", side, "--data", data]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
        return {"error": reason}
    return json.loads(lines[-1])


def check_agreement(ours: dict, oml: dict) -> float:
    """The largest |recall_at_K - cmc@K|; raises AssertionError beyond ``TOLERANCE``."""
    worst = max(abs(ours["metrics"][key] - oml["metrics"][key]) for key in ours["metrics"])
    assert worst <= TOLERANCE, f"recall_at_K and OML's cmc@K differ by {worst:.2e}: {ours} {oml}"
    return worst


def pml29_ratios(python: str, data: str) -> str:
    """bench_pml29's time and peak ratios (2.9.0 over ours, default metrics) on ``data``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import accuracy

    ours = accuracy.measure(sys.executable, "ours", data, "none")
    other = accuracy.measure(python, "pml29", data, "max_bin_count")
    if "error" in ours or "error" in other:
        return f"2.9.0 failed: {ours.get('error') or other.get('error')}"
    return (
        f"time x{other['seconds'][0] / ours['seconds'][0]:.2f}, "
        f"peak x{other['peak_mb'] / ours['peak_mb']:.2f}"
    )


HEADER = (
    "|     n | side | time s | cpu s | peak MiB | growth MiB | recall@1 | recall@5 | recall@10 |\n"
    "| ----: | :--- | -----: | ----: | -------: | ---------: | -------: | -------: | --------: |"
)


def row(n: int, side: str, run: dict) -> str:
    if "error" in run:
        return f"| {n} | {side} | failed: {run['error']} | | | | | | |"
    metrics = " | ".join(f"{run['metrics'][f'recall_at_{k}']:.6f}" for k in KS)
    return (
        f"| {n} | {side} | {run['seconds']:.2f} | {run['cpu']:.2f} | {run['peak'] / MIB:.0f} "
        f"| {(run['peak'] - run['base']) / MIB:.0f} | {metrics} |"
    )


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.data)
        return
    print(f"d={args.dims}, {args.classes} classes, self-retrieval; cores: {os.cpu_count()}")
    print(HEADER, flush=True)
    notes = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as data:
            write_data(Path(data), n, args.dims, args.classes, args.seed, args.noise)
            ours, oml = measure("ours", data), measure("oml", data)
            print(row(n, "ours", ours), flush=True)
            print(row(n, "oml", oml), flush=True)
            if "error" in ours or "error" in oml:
                notes.append(f"n={n}: failed")
                continue
            worst = check_agreement(ours, oml)
            note = (
                f"n={n}: OML/ours time x{oml['seconds'] / ours['seconds']:.2f} "
                f"(cpu x{oml['cpu'] / ours['cpu']:.2f}), peak x{oml['peak'] / ours['peak']:.2f}, "
                f"growth x{(oml['peak'] - oml['base']) / (ours['peak'] - ours['base']):.2f}; "
                f"max |recall_at_K - cmc@K| {worst:.1e}"
            )
            if args.pml29_python:
                note += f"; 2.9.0/ours (default metrics): {pml29_ratios(args.pml29_python, data)}"
            notes.append(note)
    print("\n".join(notes))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 50_000])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--noise", type=float, default=2.5, help="noise scale around the class centres"
    )
    parser.add_argument("--pml29-python", help="python of a virtualenv with 2.9.0 (nox makes one)")
    parser.add_argument("--worker", choices=["ours", "oml"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    main()
