"""What the content spot-check of a k-NN answer costs, as a fraction of the search it checks.

Every library search through a backend (AccuracyCalculator, testers, InferenceModel,
pml-eval) recomputes 256 returned pairs and scans 8 queries exactly against the whole
reference (evaluation/search/_spot_check.py), and fingerprints the inputs (row sums)
around the call. Its cost is O(8 * n * d + n * d); the search's is O(n^2 * d) for an
exact backend, so the fraction shrinks as n grows.

Baseline, measured in the same run on the same data: the backend's own self-search
producing the (n, k) answer: CustomKNN (exact, torch), and faiss's flat index when the
plugin is installed. Timings are the best of a few runs on a shared machine: noisy.

Usage: python benchmarks/spot_check.py [--sizes 20000,50000] [--dims 128] [--k 100]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _timing import best_of

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search._checked_search import input_fingerprint
from pytorch_metric_learning.evaluation.search._spot_check import spot_check_knn


def _backends() -> dict[str, Any]:
    found: dict[str, Any] = {
        "custom": CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=256)
    }
    try:
        from pytorch_metric_learning.evaluation import load_knn_func

        found["faiss flat"] = load_knn_func("faiss")
    except ImportError:
        pass
    return found


def measure(knn: Any, n: int, d: int, k: int) -> tuple[float, float]:
    """``(search seconds, spot-check + fingerprint seconds)`` of one self-search."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    distance = LpDistance(normalize_embeddings=False, power=2)
    distances, indices = knn(x, k, x, True)
    search = best_of(1, lambda: knn(x, k, x, True))

    def check() -> None:
        input_fingerprint(x, x)  # a self-search: one tensor, summed once, before and after
        input_fingerprint(x, x)
        spot_check_knn(
            distances, indices, x, k, x, True, distance=distance, backend=knn, name="bench"
        )

    return search, best_of(5, check)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000")
    parser.add_argument("--dims", default="128")
    parser.add_argument("--k", type=int, default=100)
    args = parser.parse_args()
    print(
        f"{'backend':>11} {'n':>7} {'d':>5} {'k':>5} {'search s':>9} {'check s':>9} {'check/search':>12}"
    )
    for label, knn in _backends().items():
        for n in map(int, args.sizes.split(",")):
            for d in map(int, args.dims.split(",")):
                search, check = measure(knn, n, d, args.k)
                print(
                    f"{label:>11} {n:>7} {d:>5} {args.k:>5} {search:>9.3f} {check:>9.4f} "
                    f"{check / search:>12.4%}"
                )


if __name__ == "__main__":
    main()
