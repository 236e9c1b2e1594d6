"""Time of ``pml-eval demo``, the README's main job: wall-clock and CPU seconds.

    python benchmarks/demo.py [--repeats 3] [--quick]

Each run is a fresh interpreter writing into a fresh folder, as the README's command does
(``.venv/bin/pml-eval demo``). The table gives the wall-clock and the CPU seconds (user +
system, of the run and its threads) of every run, and the load average of the machine
before each run: on a shared machine the wall-clock time grows with the load, the CPU time
much less, so both are reported. The README's claim is checked against the wall-clock
time of a run on an idle machine (load average well below the number of cores).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(quick: bool) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, 1-minute load average before) of one demo run."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "pytorch_metric_learning", "demo"]
        command += ["--output", str(Path(folder) / "pml-demo")] + (["--quick"] if quick else [])
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="time 'demo --quick' instead")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores; pml-eval demo{' --quick' if args.quick else ''}")
    print("run  wall s  CPU s  load before")
    walls = []
    for index in range(args.repeats):
        wall, cpu, load = run_once(args.quick)
        walls.append(wall)
        print(f"{index + 1:3d}  {wall:6.1f}  {cpu:5.1f}  {load:11.2f}")
    print(f"median wall-clock: {statistics.median(walls):.1f} s")


if __name__ == "__main__":
    main()
