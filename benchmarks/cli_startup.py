"""Start-up time of ``pml-eval``: help, version and argument errors must not wait for torch.

    python benchmarks/cli_startup.py [--repeats 15]

Each command runs in a fresh interpreter, ``--repeats`` times; the table gives the median
and best wall-clock seconds and the ratio of the median to a baseline measured in the same
run: ``python -c pass`` (the interpreter's own start-up) and ``python -c "import torch"``
(what every call cost when the parser imported every subcommand). Argument errors exit 2;
the other commands exit 0. The target: every row but ``import torch`` as fast as
``pml-eval --help``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass (baseline)": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
    "pml-eval --version": ["-m", "pytorch_metric_learning", "--version"],
    "pml-eval --help": ["-m", "pytorch_metric_learning", "--help"],
    "pml-eval threshold --help": ["-m", "pytorch_metric_learning", "threshold", "--help"],
    "pml-eval evaluate --help": ["-m", "pytorch_metric_learning", "evaluate", "--help"],
    "pml-eval demo --help": ["-m", "pytorch_metric_learning", "demo", "--help"],
    "pml-eval evaluate (no QUERY)": ["-m", "pytorch_metric_learning", "evaluate"],
    "pml-eval evaluate --metrics bogus": [
        *("-m", "pytorch_metric_learning", "evaluate", "q.npy", "--labels", "l.npy"),
        *("--metrics", "bogus"),
    ],
    "pml-eval evaluate --device bogus": [
        *("-m", "pytorch_metric_learning", "evaluate", "q.npy", "--labels", "l.npy"),
        *("--device", "bogus"),
    ],
    "pml-eval compare --device cuda:01": [
        *("-m", "pytorch_metric_learning", "compare", "a.npy", "b.npy", "--labels", "l.npy"),
        *("--device", "cuda:01"),
    ],
}
# the commands above that are argument errors (exit 2)
USAGE_ERRORS = {
    "pml-eval evaluate (no QUERY)",
    "pml-eval evaluate --metrics bogus",
    "pml-eval evaluate --device bogus",
    "pml-eval compare --device cuda:01",
}


def measure(arguments: list[str], repeats: int, code: int = 0) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, *arguments], capture_output=True)
        times.append(time.perf_counter() - started)
        if done.returncode != code:
            raise SystemExit(f"{arguments} exited {done.returncode}: {done.stderr.decode()}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    repeats = parser.parse_args().repeats
    results = {
        name: measure(arguments, repeats, 2 if name in USAGE_ERRORS else 0)
        for name, arguments in CASES.items()
    }
    baseline = statistics.median(results["python -c pass (baseline)"])
    torch_time = statistics.median(results["python -c 'import torch'"])
    width = max(map(len, results))
    print(f"{'command'.ljust(width)}  median s  best s  x baseline  x import torch")
    for name, times in results.items():
        median = statistics.median(times)
        print(
            f"{name.ljust(width)}  {median:8.3f}  {min(times):6.3f}  "
            f"{median / baseline:10.1f}  {median / torch_time:14.2f}"
        )


if __name__ == "__main__":
    main()
