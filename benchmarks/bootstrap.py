"""What a bootstrap interval costs: 1,000 resamples of 100,000 queries (the issue's target:
under 2 s on 2 CPU cores).

Baselines, measured in the same run:
  loop     the textbook bootstrap: one ``numpy`` index draw and mean per resample
  torch    one ``torch.randint`` index matrix per chunk and a ``take`` (the obvious
           vectorization in PyTorch)
against ``bootstrap_interval`` on
  binary      0/1 values (Recall@K, precision@1): value counts drawn as binomials
  continuous  MAP@R-like values with ~all-distinct levels: chunked index gathers
and ``paired_bootstrap`` of two binary models and ``bootstrap_interval(groups=...)`` with
1,000 classes.

Usage: python benchmarks/bootstrap.py [--queries 100000] [--resamples 1000] [--threads 2]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _timing import best_of

from pytorch_metric_learning.evaluation import bootstrap_interval, paired_bootstrap


def loop_bootstrap(values: np.ndarray, resamples: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    n = len(values)
    return np.array([values[rng.integers(0, n, n)].mean() for _ in range(resamples)])


def torch_bootstrap(values: torch.Tensor, resamples: int, chunk: int = 50) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    means = []
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        rows = torch.randint(len(values), (size, len(values)), generator=generator)
        means.append(values.take(rows).mean(dim=1))
    return torch.quantile(torch.cat(means), torch.tensor([0.025, 0.975], dtype=torch.float64))


def _one_metric(name: str, values: np.ndarray, resamples: int, repeats: int) -> str:
    tensor = torch.from_numpy(values)
    loop = best_of(repeats, lambda: loop_bootstrap(values, resamples))
    plain = best_of(repeats, lambda: torch_bootstrap(tensor, resamples))
    ours = best_of(repeats, lambda: bootstrap_interval(tensor, num_resamples=resamples))
    return (
        f"{name:<11} bootstrap_interval {ours:6.3f} s   loop {loop:6.3f} s "
        f"({loop / ours:6.1f}x)   torch.randint+take {plain:6.3f} s ({plain / ours:6.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, b = args.queries, args.resamples
    rng = np.random.default_rng(0)
    binary = (rng.random(n) < 0.7).astype(np.float64)
    continuous = rng.beta(2, 5, n)
    other = (rng.random(n) < 0.7).astype(np.float64)
    classes = torch.from_numpy(rng.integers(0, 1000, n))
    print(f"{b} resamples of {n} queries, {args.threads} torch threads (best of {args.repeats})")
    for name, values in (("binary", binary), ("continuous", continuous)):
        print(_one_metric(name, values, b, args.repeats))
    a, c = torch.from_numpy(binary), torch.from_numpy(other)
    paired = best_of(args.repeats, lambda: paired_bootstrap(a, c, num_resamples=b))
    print(f"paired_bootstrap (binary)            {paired:6.3f} s")
    grouped = best_of(
        args.repeats,
        lambda: bootstrap_interval(torch.from_numpy(continuous), num_resamples=b, groups=classes),
    )
    print(f"bootstrap_interval, 1,000 classes   {grouped:6.3f} s")


if __name__ == "__main__":
    main()
