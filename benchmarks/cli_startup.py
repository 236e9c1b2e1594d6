"""Start-up time of ``pml-eval``: ``--help`` and ``--version`` must not wait for torch.

    python benchmarks/cli_startup.py [--repeats 15]

Each command runs in a fresh interpreter, ``--repeats`` times; the table gives the median
and best wall-clock seconds and the ratio of the median to a baseline measured in the same
run: ``python -c pass`` (the interpreter's own start-up) and ``python -c "import torch"``
(what every call cost when the parser imported every subcommand).
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
}


def measure(arguments: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, *arguments], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    repeats = parser.parse_args().repeats
    results = {name: measure(arguments, repeats) for name, arguments in CASES.items()}
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
