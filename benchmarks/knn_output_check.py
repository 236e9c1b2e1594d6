"""What AccuracyCalculator's check of a k-NN answer costs, next to the search it checks.

Baseline, measured in the same run on the same data: CustomKNN's exact self-search (the
default backend) producing the (n, k) answer. The check is O(n * k); the search is
O(n^2 * d), so the ratio should shrink as n grows.

Usage: python benchmarks/knn_output_check.py [--sizes 10000,50000] [--dims 128] [--ks 10,100]
"""

from __future__ import annotations

import argparse

import torch
from _timing import best_of

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN, check_knn_output


def measure(n: int, d: int, k: int) -> tuple[float, float]:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=256)
    output = knn(x, k, x, True)
    search = best_of(1, lambda: knn(x, k, x, True))
    check = best_of(5, lambda: check_knn_output(output, x, k, x, True, backend=knn))
    return search, check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--dims", default="128")
    parser.add_argument("--ks", default="10,100")
    args = parser.parse_args()
    print(f"{'n':>7} {'d':>5} {'k':>5} {'search s':>9} {'check s':>9} {'check/search':>12}")
    for n in map(int, args.sizes.split(",")):
        for d in map(int, args.dims.split(",")):
            for k in map(int, args.ks.split(",")):
                search, check = measure(n, d, k)
                print(f"{n:>7} {d:>5} {k:>5} {search:>9.3f} {check:>9.4f} {check / search:>12.4f}")


if __name__ == "__main__":
    main()
