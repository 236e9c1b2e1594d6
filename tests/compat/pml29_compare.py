"""The 2.x helpers of utils.accuracy_calculator, here and in pytorch-metric-learning 2.9.0.

Run by ``nox -s compat_pml29``, which builds the two environments: 2.9.0 has this
project's import name, so it lives in a virtualenv of its own. The script is run by this
project's python with ``--pml29-python``; it writes random cases to a ``.pt`` file, runs
itself with ``--run`` under each python (the same calls, a different library imported),
and asserts that every output agrees (floats to a relative 1e-6, as 2.9.0 computes the
mean reciprocal rank in float32; NaN where the other side has NaN).

Cases (seeded): 1-D integer labels with plain equality; 1-D labels with a custom
``label_comparison_fn`` (labels in the same pair match); 2-D ``(coarse, fine)`` labels
with two custom comparisons; the reference separate from the query or including it; the
module-level helpers fed the same hand-made ``knn_labels``; ``_get_accuracy`` with
``get_function_dict()``; and ``get_accuracy`` on random float and integer embeddings with
one exact k-NN function shared by both sides (so only the metric code differs). With a
comparison under which a label does not match itself and the query in the reference, only
the label statistics are compared (a difference kept on purpose, see docs/migrating.md).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

KNN_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
ON_REQUEST = ("mean_average_precision", "mean_reciprocal_rank")


def same_pair(x, y):
    """1-D labels 2m and 2m+1 match each other."""
    return torch.div(x, 2, rounding_mode="floor") == torch.div(y, 2, rounding_mode="floor")


def coarse_same_fine_different(x, y):
    """2-D labels, as in 2.x's documentation; a label does not match itself."""
    return (x[..., 0] == y[..., 0]) & (x[..., 1] != y[..., 1])


def coarse_same(x, y):
    return x[..., 0] == y[..., 0]


COMPARISONS = {
    "equality": None,
    "same_pair": same_pair,
    "coarse_fine": coarse_same_fine_different,
    "coarse": coarse_same,
}
TWO_D = ("coarse_fine", "coarse")


def exact_knn(query, k, reference, ref_includes_query=False):
    """Float64 Euclidean search, ties broken by index; shared by both sides."""
    distances = torch.cdist(query.double(), reference.double())
    if ref_includes_query:
        distances[torch.arange(len(query)), torch.arange(len(query))] = math.inf
    order = torch.sort(distances, dim=1, stable=True).indices[:, :k]
    return torch.gather(distances, 1, order).float(), order


# ----- the cases -----


def make_cases(seed: int, count: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for index in range(count):
        comparison = list(COMPARISONS)[(index // 2) % len(COMPARISONS)]
        n_query = int(torch.randint(5, 60, (1,), generator=generator))
        n_ref = int(torch.randint(5, 80, (1,), generator=generator))
        num_labels = int(torch.randint(2, 9, (1,), generator=generator))
        shape = (n_query, 2) if comparison in TWO_D else (n_query,)
        ref_shape = (n_ref, 2) if comparison in TWO_D else (n_ref,)
        query_labels = torch.randint(0, num_labels, shape, generator=generator)
        reference_labels = torch.randint(0, num_labels, ref_shape, generator=generator)
        dims = int(torch.randint(1, 6, (1,), generator=generator))
        cases.append(
            {
                "comparison": comparison,
                "ref_includes_query": bool(index % 2),
                "query_labels": query_labels,
                "reference_labels": reference_labels,
                "knn_labels": reference_labels[
                    torch.randint(0, n_ref, (n_query, 7), generator=generator)
                ],
                "query": torch.randn(n_query, dims, generator=generator),
                "reference": torch.randn(n_ref, dims, generator=generator),
                "int_query": torch.randint(-50, 50, (n_query, dims), generator=generator),
            }
        )
    return cases


# ----- one side: the same calls, whichever library is installed -----


def as_plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: as_plain(v) for k, v in value.items()}
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


def not_reflexive_with_self(case: dict) -> bool:
    """A difference kept on purpose: when a label does not match itself, 2.9.0 still
    subtracts the query's own row from R (and from k="max_bin_count"), so a query that it
    counts as not lone can have R = 0: its values are NaN or inf, and one NaN makes every
    per-class average NaN. Such metric values are not compared."""
    return case["ref_includes_query"] and case["comparison"] == "coarse_fine"


def run_helpers(case: dict) -> dict:
    from pytorch_metric_learning.utils import accuracy_calculator as ac

    fn = COMPARISONS[case["comparison"]] or ac.EQUALITY
    query_labels, knn_labels = case["query_labels"], case["knn_labels"]
    ref_includes_query = case["ref_includes_query"]
    reference_labels = case["reference_labels"]
    if ref_includes_query:  # the reference starts with the query, as 2.x requires
        reference_labels = torch.cat([query_labels, reference_labels])
    out = {}
    label_counts = ac.get_label_match_counts(query_labels, reference_labels, fn)
    lone, not_lone = ac.get_lone_query_labels(query_labels, label_counts, ref_includes_query, fn)
    out["label_counts"], out["lone"], out["not_lone"] = label_counts, lone, not_lone
    out["unique"] = ac.get_unique_labels(query_labels)
    knn, query = ac.try_getting_not_lone_labels(knn_labels, query_labels, not_lone)
    if knn is None or not_reflexive_with_self(case):
        return out
    gt = query[:, None]
    for avg_of_avgs, per_class in [(False, False), (True, False), (False, True)]:
        tag = f"avg={avg_of_avgs},per_class={per_class}"
        for k in (1, 3, 7):
            out[f"precision_at_{k} {tag}"] = ac.precision_at_k(
                knn, gt, k, avg_of_avgs, per_class, fn
            )
        args = (knn, gt, ref_includes_query, label_counts, avg_of_avgs, per_class, fn)
        out[f"r_precision {tag}"] = ac.r_precision(*args)
        out[f"map {tag}"] = ac.mean_average_precision(*args)
        out[f"map_at_r {tag}"] = ac.mean_average_precision(*args, at_r=True)
        out[f"mrr {tag}"] = ac.mean_reciprocal_rank(knn, gt, avg_of_avgs, per_class, fn)
        values = torch.linspace(0, 1, len(gt), dtype=torch.float64)
        out[f"maybe_get_avg_of_avgs {tag}"] = ac.maybe_get_avg_of_avgs(
            values, gt, avg_of_avgs, per_class
        )
    return out


def run_calculator(case: dict) -> dict:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    fn = COMPARISONS[case["comparison"]]
    out = {}
    for k in ("max_bin_count", None, 3) if not not_reflexive_with_self(case) else ():
        calc = AccuracyCalculator(
            include=KNN_METRICS + ON_REQUEST, k=k, label_comparison_fn=fn, knn_func=exact_knn
        )
        tag = f"k={k}"
        out[f"function_dict {tag}"] = sorted(calc.get_function_dict())
        out[f"get_accuracy {tag}"] = attempt(_get_accuracy, calc, case, "query")
        if fn is None:  # 2.x cast integer embeddings to float
            out[f"get_accuracy int {tag}"] = attempt(_get_accuracy, calc, case, "int_query")
    kwargs = _knn_kwargs(case, fn)
    calc = AccuracyCalculator(exclude=("NMI", "AMI"), label_comparison_fn=fn, knn_func=exact_knn)
    # 2.9.0 also selects MAP and MRR by default (a difference kept on purpose): compare
    # the metrics both select.
    accuracies = calc._get_accuracy(calc.get_function_dict(), **kwargs)
    out["_get_accuracy exclude"] = {k: v for k, v in accuracies.items() if k in KNN_METRICS}
    calc = AccuracyCalculator(
        include=KNN_METRICS + ON_REQUEST, exclude=("r_precision",), label_comparison_fn=fn
    )
    narrowed = calc.get_function_dict(exclude=("precision_at_1",))
    out["function_dict narrowed"] = sorted(narrowed)
    out["_get_accuracy narrowed"] = calc._get_accuracy(narrowed, **kwargs)
    return out


def attempt(function, *args):
    """The result, or ``{"raised": name}`` (2.9.0 fails on some edge cases, e.g. k=0)."""
    try:
        return function(*args)
    except Exception as error:
        return {"raised": type(error).__name__}


def _get_accuracy(calc, case: dict, query_key: str) -> dict:
    query = case[query_key]
    if case["ref_includes_query"]:
        return calc.get_accuracy(query, case["query_labels"])
    reference = case["reference"] if query_key == "query" else case["reference"].round() * 9
    return calc.get_accuracy(
        query, case["query_labels"], reference.to(query.dtype), case["reference_labels"]
    )


def _knn_kwargs(case: dict, fn) -> dict:
    from pytorch_metric_learning.utils import accuracy_calculator as ac

    fn = fn or ac.EQUALITY
    label_counts = ac.get_label_match_counts(case["query_labels"], case["reference_labels"], fn)
    _, not_lone = ac.get_lone_query_labels(case["query_labels"], label_counts, False, fn)
    return {
        "query_labels": case["query_labels"],
        "knn_labels": case["knn_labels"],
        "label_counts": label_counts,
        "not_lone_query_mask": not_lone,
        "ref_includes_query": False,
    }


def run_side(cases_path: str, out_path: str) -> None:
    cases = torch.load(cases_path, weights_only=True)
    results = [{**run_helpers(case), **run_calculator(case)} for case in cases]
    Path(out_path).write_text(json.dumps(as_plain(results)))


# ----- the comparison -----


def differences(ours, theirs, where: str = "", skipped: list | None = None) -> list[str]:
    """What differs; where only 2.9.0 raised, the path goes to ``skipped`` instead."""
    skipped = [] if skipped is None else skipped
    if isinstance(theirs, dict) and set(theirs) == {"raised"} and ours != theirs:
        skipped.append(f"{where}: 2.9.0 raised {theirs['raised']}, ours {ours!r}")
        return []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if set(ours) != set(theirs):
            return [f"{where}: keys {sorted(set(ours) ^ set(theirs))} on one side only"]
        return [
            d
            for key in ours
            for d in differences(ours[key], theirs[key], f"{where}/{key}", skipped)
        ]
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} items against {len(theirs)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(ours, theirs))
            for d in differences(a, b, f"{where}[{i}]", skipped)
        ]
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        if math.isnan(ours) and math.isnan(theirs):
            return []
        if math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=1e-9):
            return []
    elif ours == theirs:
        return []
    return [f"{where}: ours {ours!r}, 2.9.0 {theirs!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pml29-python", help="python of a virtualenv with 2.9.0")
    parser.add_argument("--run", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.run:
        run_side(*args.run)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        cases_path = str(Path(folder) / "cases.pt")
        torch.save(make_cases(args.seed, args.cases), cases_path)
        outputs = {}
        for side, python in (("ours", sys.executable), ("pml29", args.pml29_python)):
            out = str(Path(folder) / f"{side}.json")
            subprocess.run([python, __file__, "--run", cases_path, out], check=True, timeout=1800)
            outputs[side] = json.loads(Path(out).read_text())
    skipped: list[str] = []
    found = differences(outputs["ours"], outputs["pml29"], skipped=skipped)
    compared = sum(len(case) for case in outputs["ours"])
    print(f"{args.cases} cases, {compared} outputs compared, {len(found)} differ")
    print(f"{len(skipped)} outputs where only 2.9.0 raised (not compared):")
    for line in skipped[:10]:
        print("  " + line)
    for line in found[:40]:
        print("  " + line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
