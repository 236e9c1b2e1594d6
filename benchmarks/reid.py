"""The re-identification protocol's cost: the search with its exclusions against the same
search without them.

A Market-1501-like set: identities seen by several cameras, junk (-1) and distractor (0)
gallery images. Measured, best of --repeats (the machine may be shared, so the numbers are
noisy; the ratio is what matters):
  search      CustomKNN(query, k, gallery)                       no exclusions
  search_reid the same k, with the same-identity-same-camera rule and the junk as an
              Exclusion, applied inside the tiles (search_excluding)
  calc        AccuracyCalculator(recall_at_1/5/10/20, k=K).get_accuracy(...)       no groups
  calc_reid   the same with query_groups, reference_groups, junk and distractor labels
mAP and mINP over every candidate (k=None) ask for the whole ranking: a
num_query x num_gallery output (13 GB at the default size), as without the protocol.

Usage: python benchmarks/reid.py [--queries 20000] [--gallery 50000] [--dims 128] [--k 50]
    [--repeats 2]
"""

from __future__ import annotations

import argparse
import json

import torch
from _timing import best_of

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import AccuracyCalculator, CustomKNN, Exclusion
from pytorch_metric_learning.evaluation.search._excluded_search import search_excluding
from pytorch_metric_learning.evaluation.search.exclusion import key_pairs

METRICS = ("recall_at_1", "recall_at_5", "recall_at_10", "recall_at_20")


def camera_set(queries: int, gallery: int, dims: int) -> dict[str, torch.Tensor]:
    """Identities 1..I around random centres, 6 cameras, 5% junk and 10% distractors."""
    generator = torch.Generator().manual_seed(0)
    identities = max(2, gallery // 20)
    centres = torch.randn(identities + 1, dims, generator=generator)
    query_ids = torch.randint(1, identities + 1, (queries,), generator=generator)
    gallery_ids = torch.randint(1, identities + 1, (gallery,), generator=generator)
    draw = torch.rand(gallery, generator=generator)
    gallery_ids[draw < 0.15] = 0
    gallery_ids[draw < 0.05] = -1
    noise = 1.5
    return {
        "query": centres[query_ids] + noise * torch.randn(queries, dims, generator=generator),
        "gallery": centres[gallery_ids.clamp_min(0)]
        + noise * torch.randn(gallery, dims, generator=generator),
        "query_ids": query_ids,
        "gallery_ids": gallery_ids,
        "query_cams": torch.randint(0, 6, (queries,), generator=generator),
        "gallery_cams": torch.randint(0, 6, (gallery,), generator=generator),
    }


def reid_exclusion(data: dict[str, torch.Tensor]) -> Exclusion:
    """Same identity and camera, plus the junk images, as the calculator builds them."""
    num_gallery = len(data["gallery"])
    query_keys, gallery_keys = key_pairs(
        torch.cat([data["query_ids"], data["gallery_ids"]]),
        torch.cat([data["query_cams"], data["gallery_cams"]]),
        num_gallery,
    )
    return Exclusion(
        len(data["query"]),
        num_gallery,
        same_keys=[(query_keys, gallery_keys)],
        never_candidates=data["gallery_ids"] == -1,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20000)
    parser.add_argument("--gallery", type=int, default=50000)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    data = camera_set(args.queries, args.gallery, args.dims)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    exclusion = reid_exclusion(data)
    query, gallery = data["query"], data["gallery"]
    calculator = AccuracyCalculator(include=METRICS, k=args.k, knn_func=knn)
    plain_args = (query, data["query_ids"], gallery, data["gallery_ids"])
    protocol = {
        "query_groups": data["query_cams"],
        "reference_groups": data["gallery_cams"],
        "junk_labels": (-1,),
        "distractor_labels": (0,),
    }
    knn(query[:100], args.k, gallery)  # load the compiled top-k once, outside the timings
    times = {
        "search": best_of(args.repeats, lambda: knn(query, args.k, gallery)),
        "search_reid": best_of(
            args.repeats, lambda: search_excluding(knn, query, args.k, gallery, exclusion)
        ),
        "calc": best_of(args.repeats, lambda: calculator.get_accuracy(*plain_args)),
        "calc_reid": best_of(
            args.repeats, lambda: calculator.get_accuracy(*plain_args, **protocol)
        ),
    }
    result = {
        "queries": args.queries,
        "gallery": args.gallery,
        "dims": args.dims,
        "k": args.k,
        "threads": torch.get_num_threads(),
        "seconds": {name: round(value, 3) for name, value in times.items()},
        "ratio_search": round(times["search_reid"] / times["search"], 3),
        "ratio_calculator": round(times["calc_reid"] / times["calc"], 3),
    }
    print(json.dumps(result, indent=2))
    print("(timings on a shared machine are noisy; the goal is a ratio of at most 1.2)")


if __name__ == "__main__":
    main()
