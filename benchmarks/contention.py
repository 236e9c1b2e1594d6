"""AccuracyCalculator speed when another process shares the cores: ours (default threads and
one thread) against pytorch-metric-learning 2.9.0, idle and beside a busy neighbour.

    python benchmarks/contention.py --pml29-python <2.9.0 venv>/bin/python
    nox -s bench_contention              # builds the 2.9.0 venv, then runs the line above
    python benchmarks/contention.py --quick   # one small cell, for development

Every cell (n, classes, idle or busy) measures, in the same run, three sides, each in a
fresh process that calls ``get_accuracy`` ``--calls`` times on the same data (as a
training loop does every epoch):

  default   ours, ``AccuracyCalculator(include=("recall_at_1", "recall_at_10"))``, with
            the thread count the library chooses
  one       the same after ``torch.set_num_threads(1)`` (a user-set count wins)
  off       (only with ``--sides``) ours with ``PML_NUM_THREADS=0``: PyTorch's thread
            count as it is, whatever the load (what the library did before it adapted)
  pml29     2.9.0 (its own virtualenv), ``AccuracyCalculator(include=("precision_at_1",),
            k=10)``: the same 10-neighbour faiss search (its default backend) and
            precision@1 (= recall@1), with faiss's default threads

"busy" starts a neighbour process that spins (a bounded ``while`` loop) on one core of
this process's affinity, pinned there with ``os.sched_setaffinity``, before each side's
process and stops it after; the neighbour also stops by itself after ``--neighbour-limit``
seconds, so an interrupted run leaves nothing behind. "first" is the first call of a
fresh process (with whatever it loads: numba's compiled loops here, faiss's threads
there), "later" the median of the others. The sides take turns, ``--repeats`` processes
each, and the median of each is kept. Ratios: ``default / one`` (goal under load: at most
1.3) and ``pml29 / default`` (goal: at least 1.5; above 1 ours is faster).
Data: ``n`` unit-norm d=128 embeddings, ``classes`` Gaussian classes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIDES = ("default", "one", "pml29", "off")
OURS_METRICS = ("recall_at_1", "recall_at_10")
# The neighbour: spin until killed, or until its time limit.
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"


def make_data(n: int, dims: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm embeddings of Gaussian classes (a random centre per class plus noise)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centers = rng.standard_normal((classes, dims)).astype(np.float32)
    x = centers[labels] + 1.4 * rng.standard_normal((n, dims)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, labels.astype(np.int64)


def worker(side: str, data_dir: str, calls: int) -> None:
    """Time ``calls`` evaluations in this process; print one JSON line."""
    import torch

    if side == "one":
        torch.set_num_threads(1)
    x = torch.from_numpy(np.load(os.path.join(data_dir, "x.npy")))
    labels = torch.from_numpy(np.load(os.path.join(data_dir, "labels.npy")))
    start = time.perf_counter()
    if side == "pml29":
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        calculator = AccuracyCalculator(
            include=("precision_at_1",), k=10, device=torch.device("cpu")
        )
    else:
        from pytorch_metric_learning.evaluation import AccuracyCalculator

        calculator = AccuracyCalculator(include=OURS_METRICS)
    setup = time.perf_counter() - start
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        results = calculator.get_accuracy(x, labels)
        seconds.append(time.perf_counter() - start)
    first = float(results["precision_at_1" if side == "pml29" else "recall_at_1"])
    print(json.dumps({"seconds": seconds, "setup": setup, "recall_at_1": first}))


class Neighbour:
    """A process spinning on one core of ours (the last), for at most ``limit`` seconds."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.core = max(os.sched_getaffinity(0))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Neighbour:
        self.process = subprocess.Popen([sys.executable, "-c", SPIN, str(self.limit)])
        os.sched_setaffinity(self.process.pid, {self.core})
        time.sleep(0.2)  # let it take its core before the measured process starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def measure(python: str, side: str, data_dir: str, calls: int, timeout: float) -> dict:
    """One fresh process of ``side``; its JSON line, or ``{"error": ...}``."""
    command = [python, os.path.abspath(__file__), "--worker", side, "--data", data_dir]
    env = dict(os.environ)
    if side == "pml29":  # 2.9.0 has our import name: never let it see our path
        env.pop("PYTHONPATH", None)
    if side == "off":
        env["PML_NUM_THREADS"] = "0"
    try:
        done = subprocess.run(
            [*command, "--calls", str(calls)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    """Median first call and median later call over the runs without errors."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return {"error": runs[0]["error"]}
    later = [statistics.median(run["seconds"][1:]) for run in good if len(run["seconds"]) > 1]
    return {
        "first": statistics.median(run["seconds"][0] for run in good),
        "later": statistics.median(later) if later else None,
        "first_all": [run["seconds"][0] for run in good],
        "recall_at_1": good[0]["recall_at_1"],
    }


def measure_cell(args: argparse.Namespace, data_dir: str, busy: bool) -> dict[str, dict]:
    """Every side of one cell, the sides taking turns, ``args.repeats`` processes each."""
    pythons = {side: sys.executable for side in SIDES}
    pythons["pml29"] = args.pml29_python
    sides = [side for side in args.sides if pythons[side]]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            if busy:
                with Neighbour(args.neighbour_limit):
                    found = measure(pythons[side], side, data_dir, args.calls, args.timeout)
            else:
                found = measure(pythons[side], side, data_dir, args.calls, args.timeout)
            runs[side].append(found)
    return {side: summarize(found) for side, found in runs.items()}


def ratio(numerator: dict | None, denominator: dict | None, when: str) -> float | None:
    """``numerator[when] / denominator[when]``; None if a side is missing or failed."""
    if numerator is None or denominator is None:
        return None
    if "error" in numerator or "error" in denominator:
        return None
    top, bottom = numerator.get(when), denominator.get(when)
    return None if top is None or bottom is None else top / bottom


def row(n: int, classes: int, load: str, cell: dict[str, dict]) -> str:
    """One line of the table: each side's first and later seconds, then the ratios."""
    parts = [f"{n:>7} {classes:>5} {load:<5}"]
    for side, found in cell.items():
        if "error" in found:
            parts.append(f"{side} failed ({found['error']})")
            continue
        later = "   -  " if found["later"] is None else f"{found['later']:6.2f}"
        parts.append(f"{side} {found['first']:6.2f} {later}")
    for when in ("first", "later"):
        one = ratio(cell.get("default"), cell.get("one"), when)
        old = ratio(cell.get("pml29"), cell.get("default"), when)
        parts.append(
            f"{when}: default/one {_show(one)}{_mark(one, 1.3, above=False)}"
            f" pml29/default {_show(old)}{_mark(old, 1.5, above=True)}"
        )
    return " | ".join(parts)


def _show(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.2f}"


def _mark(value: float | None, goal: float, above: bool) -> str:
    if value is None:
        return " "
    return " " if (value >= goal if above else value <= goal) else "!"


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.data, args.calls)
        return
    # a terminated run still stops its neighbour and its measured process (as Ctrl-C does)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(
        f"cores {sorted(os.sched_getaffinity(0))}, {args.calls} calls per process, median of "
        f"{args.repeats} processes; seconds: first call, later calls (median); "
        "'!' marks a ratio that misses its goal (default/one <= 1.3, pml29/default >= 1.5)",
        flush=True,
    )
    records = []
    for n in args.sizes:
        for classes in args.classes:
            with tempfile.TemporaryDirectory() as data_dir:
                x, labels = make_data(n, 128, classes, args.seed)
                np.save(os.path.join(data_dir, "x.npy"), x)
                np.save(os.path.join(data_dir, "labels.npy"), labels)
                for load in args.loads:
                    cell = measure_cell(args, data_dir, busy=load == "busy")
                    print(row(n, classes, load, cell), flush=True)
                    records.append({"n": n, "classes": classes, "load": load, **cell})
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 50_000])
    parser.add_argument("--classes", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--loads", nargs="+", choices=["idle", "busy"], default=["idle", "busy"])
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=["default", "one", "pml29"], help="sides"
    )
    parser.add_argument("--calls", type=int, default=3, help="get_accuracy calls per process")
    parser.add_argument("--repeats", type=int, default=3, help="processes per side and cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pml29-python", help="python of a virtualenv with 2.9.0 (nox makes one)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument(
        "--neighbour-limit", type=float, default=600.0, help="seconds the neighbour spins at most"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process at most")
    parser.add_argument(
        "--quick", action="store_true", help="n=20,000, 100 classes, 1 repeat of 2 calls"
    )
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.classes, args.repeats, args.calls = [20_000], [100], 1, 2
    return args


if __name__ == "__main__":
    main()
