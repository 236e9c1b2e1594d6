"""Distributed exact k-NN on one machine: 1, 2 and 4 gloo CPU processes as the gallery grows.

Self-retrieval (``ref_includes_query=True``): each rank holds ``n / world`` rows, which are
both its query and its reference shard. Every process uses one thread, so on a machine
with at least 4 free cores the ideal time falls as 1 / world (each rank searches all
queries against its shard). Per-rank peak memory is the growth of the process's peak
resident set during the search.

Baseline, measured in the same run: a single process with one thread running CustomKNN on
the whole gallery (``speedup`` is its time divided by the distributed time). ``comm MiB``
is what one rank receives (queries and partial results), counted on paper.

Usage: python benchmarks/distributed.py [--sizes 5000,20000] [--dims 64] [--k 10]
       [--worlds 1,2,4] [--block-size 1024]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _memory import peak_rss_bytes


def _data(n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(0))


def _shard(n: int, world: int, rank: int) -> slice:
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def _peak_mib() -> float:
    return peak_rss_bytes() / 2**20


def _rank_main(rank: int, world: int, config: dict, directory: str) -> None:
    from pytorch_metric_learning.evaluation.distributed import DistributedKNN

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(directory, 'init')}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=10),
    )
    x = _data(config["n"], config["d"])[_shard(config["n"], world, rank)].clone()
    knn = DistributedKNN(block_size=config["block_size"])
    knn(x[:64], 1, x[:64], True)  # warm up the thread pool and the group's connections
    dist.barrier()
    before = _peak_mib()
    start = time.perf_counter()
    knn(x, config["k"], x, True)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "peak_mib": _peak_mib() - before}
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    dist.destroy_process_group()


def _single_main(_: int, config: dict, directory: str) -> None:
    from pytorch_metric_learning.evaluation import load_knn_func

    torch.set_num_threads(1)
    x = _data(config["n"], config["d"])
    knn = load_knn_func("custom")
    knn(x[:64], 1, x[:64], True)
    before = _peak_mib()
    start = time.perf_counter()
    knn(x, config["k"], x, True)
    result = {"seconds": time.perf_counter() - start, "peak_mib": _peak_mib() - before}
    with open(os.path.join(directory, "rank0.json"), "w") as handle:
        json.dump(result, handle)


def _single(config: dict) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(_single_main, args=(config, directory), nprocs=1, join=True)
        with open(os.path.join(directory, "rank0.json")) as handle:
            return json.load(handle)


def _run_world(world: int, config: dict) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(_rank_main, args=(world, config, directory), nprocs=world, join=True)
        ranks = []
        for rank in range(world):
            with open(os.path.join(directory, f"rank{rank}.json")) as handle:
                ranks.append(json.load(handle))
    return {
        "seconds": max(r["seconds"] for r in ranks),
        "peak_mib": max(r["peak_mib"] for r in ranks),
    }


def _comm_mib(world: int, config: dict) -> float:
    """Bytes one rank receives: every other rank's queries, and k+1 partial results each."""
    if world == 1:
        return 0.0
    rows = config["n"] / world
    per_row = config["d"] * 4 + (config["k"] + 1) * (4 + 8)
    return (world - 1) * rows * per_row / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,20000")
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--block-size", type=int, default=1024)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread per process")
    print(f"{'n':>7} {'world':>5} {'seconds':>8} {'speedup':>8} {'peak MiB':>9} {'comm MiB':>9}")
    for n in map(int, args.sizes.split(",")):
        config = {"n": n, "d": args.dims, "k": args.k, "block_size": args.block_size}
        baseline = _single(config)
        _print(n, "single", baseline, 1.0, 0.0)
        for world in map(int, args.worlds.split(",")):
            result = _run_world(world, config)
            _print(
                n,
                str(world),
                result,
                baseline["seconds"] / result["seconds"],
                _comm_mib(world, config),
            )
        sys.stdout.flush()


def _print(n: int, world: str, result: dict[str, float], speedup: float, comm: float) -> None:
    print(
        f"{n:>7} {world:>5} {result['seconds']:>8.3f} {speedup:>8.2f} "
        f"{result['peak_mib']:>9.1f} {comm:>9.2f}"
    )


if __name__ == "__main__":
    main()
