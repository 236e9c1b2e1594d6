"""The single-gallery-shot CMC's cost at Market-1501's size (3,368 queries x 15,913
gallery images, about 750 identities, CMC to rank 50).

Measured, best of --repeats (the machine may be shared, so the numbers are noisy):
  market        AccuracyCalculator(recall_at_1/5/10/20/50, mean_average_precision, k=None)
                with the re-ID protocol (camera rule, junk, distractors)
  single_shot   the same with single_gallery_shot=True (the exact expectation)
  draws_10      the same with single_gallery_shot_draws=10 (torchreid's number of draws)
``--random`` draws every embedding at random (no identity structure: the hardest case for
the expectation, whose work grows with the identities ranked before each relevant image).

Usage: python benchmarks/single_gallery_shot.py [--queries 3368] [--gallery 15913]
    [--dims 128] [--random] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from _timing import best_of
from reid import camera_set

from pytorch_metric_learning.evaluation import AccuracyCalculator

METRICS = (
    "recall_at_1",
    "recall_at_5",
    "recall_at_10",
    "recall_at_20",
    "recall_at_50",
    "mean_average_precision",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3368)
    parser.add_argument("--gallery", type=int, default=15913)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--random", action="store_true")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    data = camera_set(args.queries, args.gallery, args.dims)
    if args.random:
        generator = torch.Generator().manual_seed(1)
        data["query"] = torch.randn(args.queries, args.dims, generator=generator)
        data["gallery"] = torch.randn(args.gallery, args.dims, generator=generator)
    calculator = AccuracyCalculator(include=METRICS, k=None)
    arguments = (data["query"], data["query_ids"], data["gallery"], data["gallery_ids"])
    protocol = {
        "query_groups": data["query_cams"],
        "reference_groups": data["gallery_cams"],
        "junk_labels": (-1,),
        "distractor_labels": (0,),
    }

    def draws() -> None:
        np.random.seed(0)
        calculator.get_accuracy(
            *arguments, **protocol, single_gallery_shot=True, single_gallery_shot_draws=10
        )

    times = {
        "market": best_of(args.repeats, lambda: calculator.get_accuracy(*arguments, **protocol)),
        "single_shot": best_of(
            args.repeats,
            lambda: calculator.get_accuracy(*arguments, **protocol, single_gallery_shot=True),
        ),
        "draws_10": best_of(args.repeats, draws),
    }
    result = {
        "queries": args.queries,
        "gallery": args.gallery,
        "identities": int(data["gallery_ids"].unique().numel()),
        "random": args.random,
        "threads": torch.get_num_threads(),
        "seconds": {name: round(value, 3) for name, value in times.items()},
    }
    print(json.dumps(result, indent=2))
    print("(timings on a shared machine are noisy)")


if __name__ == "__main__":
    main()
