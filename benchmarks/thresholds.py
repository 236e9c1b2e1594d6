"""Threshold selection against scikit-learn's roc_curve on the same data, in the same run.

roc_curve is what users would otherwise call to sweep thresholds: it also sorts the scores
once and takes cumulative sums. Each timing is the best of ``--repeats`` runs; the ratio is
roc_curve's time divided by ours (above 1: we are faster).

    python benchmarks/thresholds.py [--sizes 1000000 10000000] [--repeats 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import best_of
from sklearn.metrics import roc_curve

from pytorch_metric_learning.evaluation import match_accuracy, select_threshold, threshold_curve


def make_pairs(size: int, dtype: type, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Similarities where matching pairs score higher."""
    generator = np.random.default_rng(seed)
    labels = generator.random(size) < 0.3
    scores = generator.standard_normal(size) + 1.5 * labels
    return scores.astype(dtype), labels


def measure(size: int, dtype: type, repeats: int) -> str:
    scores, labels = make_pairs(size, dtype)
    baseline = best_of(repeats, lambda: roc_curve(labels, scores))
    select = best_of(
        repeats, lambda: select_threshold(scores, labels, match_accuracy, is_inverted=True)
    )
    curve = best_of(repeats, lambda: threshold_curve(scores, labels, is_inverted=True))
    return (
        f"{size:>10} {np.dtype(dtype).name:>8} {baseline:>12.3f} {select:>9.3f} "
        f"{baseline / select:>6.2f} {curve:>8.3f} {baseline / curve:>6.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    header = f"{'pairs':>10} {'dtype':>8} {'roc_curve s':>12} {'select s':>9} {'ratio':>6}"
    print(header + f" {'curve s':>8} {'ratio':>6}")
    for size in args.sizes:
        for dtype in (np.float32, np.float64):
            print(measure(size, dtype, args.repeats), flush=True)


if __name__ == "__main__":
    main()
