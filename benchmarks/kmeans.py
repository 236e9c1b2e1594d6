"""TorchKMeans speed and clustering quality against faiss's k-means, in the same run.

Data: the class-clustered embeddings of benchmarks/accuracy.py (d = 128, ``--classes``
classes); every method clusters them into as many clusters as there are classes, as
AccuracyCalculator does for NMI and AMI. Methods:

  torch       TorchKMeans() defaults: trains on at most 256 rows per cluster (faiss's
              default), then one assignment pass over every row
  torch_full  TorchKMeans(max_points_per_centroid=None): trains on every row
  faiss       faiss.Kmeans(d, k, niter=20), as pytorch-metric-learning 2.9.0 calls it, then
              one search of every row (skipped when faiss is not installed)

Each time is the best of ``--repeats`` runs with seed 0, the methods taking turns within
each repeat (the machine may be shared; the minimum is the steadiest estimate). NMI and AMI
are against the class labels, averaged over ``--seeds`` seeds (one seed's value moves by
about 0.005 from seed to seed), and "vs full" is the NMI between the method's clusters and
torch_full's (seed 0): how much the training sample changes the clustering. ``faiss/torch``
above 1 means TorchKMeans is faster.

Usage: python benchmarks/kmeans.py [--sizes 50000] [--classes 100 1000 2000] [--repeats 3]
                                  [--seeds 1] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy import make_data  # noqa: E402

from pytorch_metric_learning.evaluation import (  # noqa: E402
    TorchKMeans,
    adjusted_mutual_info,
    normalized_mutual_info,
)

Method = Callable[[np.ndarray, int, int], np.ndarray]


def _torch(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    return TorchKMeans(seed=seed)(torch.from_numpy(x), k).numpy()


def _torch_full(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    kmeans = TorchKMeans(seed=seed, max_points_per_centroid=None)
    return kmeans(torch.from_numpy(x), k).numpy()


def _faiss(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    import faiss

    kmeans = faiss.Kmeans(x.shape[1], k, niter=20, verbose=False, seed=1234 + seed)
    kmeans.train(x)
    return kmeans.index.search(x, 1)[1][:, 0]


def methods() -> dict[str, Method]:
    found: dict[str, Method] = {"torch": _torch, "torch_full": _torch_full}
    try:
        import faiss  # noqa: F401
    except ImportError:
        return found
    found["faiss"] = _faiss
    return found


def best_times(
    found: dict[str, Method], x: np.ndarray, k: int, repeats: int
) -> dict[str, tuple[float, np.ndarray]]:
    """Best time and last clusters of each method; the methods alternate within each
    repeat, so that they share the machine's load alike."""
    best = {name: (float("inf"), np.empty(0)) for name in found}
    for _ in range(repeats):
        for name, method in found.items():
            start = time.perf_counter()
            clusters = method(x, k, 0)
            best[name] = (min(best[name][0], time.perf_counter() - start), clusters)
    return best


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(threads)


def nmi(first: np.ndarray, second: np.ndarray) -> float:
    return normalized_mutual_info(torch.from_numpy(first), torch.from_numpy(second))


def mean_scores(
    method: Method, x: np.ndarray, labels: np.ndarray, k: int, seeds: int, first: np.ndarray
) -> tuple[float, float]:
    """NMI and AMI against ``labels``, averaged over seeds 0 (``first``, already run) to
    ``seeds - 1``."""
    runs = [first] + [method(x, k, seed) for seed in range(1, seeds)]
    truth = torch.from_numpy(labels)
    nmis = [normalized_mutual_info(truth, torch.from_numpy(run)) for run in runs]
    amis = [adjusted_mutual_info(truth, torch.from_numpy(run)) for run in runs]
    return float(np.mean(nmis)), float(np.mean(amis))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000])
    parser.add_argument("--classes", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=1, help="seeds NMI and AMI average over")
    parser.add_argument("--threads", type=int, help="torch and faiss threads (default: theirs)")
    args = parser.parse_args()
    if args.threads:
        set_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d={args.dims}")
    print("|       n |    k | method     | best s | faiss/torch |   NMI |   AMI | vs full |")
    print("| ------: | ---: | :--------- | -----: | ----------: | ----: | ----: | ------: |")
    for n in args.sizes:
        for classes in args.classes:
            x, labels = make_data(n, args.dims, classes, seed=0)
            k = len(np.unique(labels))
            found = methods()
            results = best_times(found, x, k, args.repeats)
            for name, (seconds, clusters) in results.items():
                ratio = results["faiss"][0] / seconds if "faiss" in results else float("nan")
                scores = mean_scores(found[name], x, labels, k, args.seeds, clusters)
                print(
                    f"| {n:7d} | {k:4d} | {name:<10} | {seconds:6.2f} | {ratio:11.2f} "
                    f"| {scores[0]:.3f} | {scores[1]:.3f} "
                    f"| {nmi(results['torch_full'][1], clusters):7.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
