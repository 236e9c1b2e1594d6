"""``pml-eval compare``: is model B better than model A on the same queries, beyond noise?

Both models' embeddings of the same queries are scored with the same metrics, and a
paired bootstrap over the queries (or, with ``--ci-by-class``, over whole classes) gives
the difference's interval and the one-sided p-value of "B is no better than A".
"""

from __future__ import annotations

import argparse
from typing import Any

from ..evaluation import PairedComparison, compare_per_query
from ._intervals import bootstrap_settings
from ._output import format_number, format_table, write_results
from ._paths import check_outputs
from ._versions import environment_versions
from .evaluate import (
    EvaluationInputs,
    build_calculator,
    compute_metrics,
    load_inputs,
    resolve_device,
)
from .loaders import check_one_stdin
from .parsers.compare import COMPARED_METRICS, check_references, input_files

__all__ = ["COMPARED_METRICS", "run"]


def run(args: argparse.Namespace) -> int:
    """Score both models, compare them, print a table and/or write JSON; return 0."""
    check_references(args)
    check_one_stdin(
        {
            "A_QUERY": args.a_query,
            "B_QUERY": args.b_query,
            "--labels": args.labels,
            "--reference": args.reference,
            "--reference-labels": args.reference_labels,
        }
    )
    check_outputs({"--output": args.output}, input_files(args))
    args.device = resolve_device(args.device)
    models = {name: _model_args(args, name) for name in ("a", "b")}
    # One labels file for both models: each model's files must have its length.
    inputs = {name: load_inputs(model) for name, model in models.items()}
    per_query = {
        name: _per_query(build_calculator(models[name]), inputs[name], args) for name in models
    }
    compared = compare_per_query(
        per_query["a"], per_query["b"], args.ci, args.resamples, args.seed, args.ci_by_class
    )
    if args.output != "-":
        print(_describe(args, inputs["a"]))
        print(_render(compared, args.ci))
    if args.output:
        write_results(args.output, _record(compared, args, inputs["a"]))
    return 0


def _model_args(args: argparse.Namespace, model: str) -> argparse.Namespace:
    """The ``evaluate`` options for one model's files."""
    index = 0 if model == "a" or args.reference is None else len(args.reference) - 1
    return argparse.Namespace(
        query=args.a_query if model == "a" else args.b_query,
        labels=args.labels,
        reference=None if args.reference is None else args.reference[index],
        reference_labels=args.reference_labels,
        ref_includes_query=args.ref_includes_query,
        metrics=args.metrics,
        avg_of_avgs=False,
        per_class=False,
        k=None,
        device=args.device,
        knn=args.knn,
        kmeans=None,
    )


def _per_query(calculator: Any, inputs: EvaluationInputs, args: argparse.Namespace) -> Any:
    results = compute_metrics(calculator, inputs, args.ref_includes_query, True)
    return results["per_query"]


def _describe(args: argparse.Namespace, inputs: EvaluationInputs) -> str:
    target = "the other queries" if args.reference is None else "each model's reference"
    unit = "classes" if args.ci_by_class else "queries"
    return (
        f"A: {args.a_query}  B: {args.b_query}  ({len(inputs.query)} queries searched in "
        f"{target})\nPaired bootstrap over {unit}: {args.resamples} resamples, seed {args.seed}; "
        "p = P(B is no better than A)\n"
    )


def _render(compared: dict[str, PairedComparison], level: float) -> str:
    header = ["metric", "A", "B", "B - A", f"{level * 100:g}% interval", "p"]
    rows = [
        [
            name,
            result.a,
            result.b,
            f"{result.difference:+.4f}",
            f"[{result.low:+.4f}, {result.high:+.4f}]",
            format_number(result.p_value),
        ]
        for name, result in compared.items()
    ]
    return format_table(header, rows)


def _record(
    compared: dict[str, PairedComparison], args: argparse.Namespace, inputs: EvaluationInputs
) -> dict[str, Any]:
    return {
        "comparison": {name: result.as_dict() for name, result in compared.items()},
        "settings": {
            "a_query": args.a_query,
            "b_query": args.b_query,
            "labels": args.labels,
            "reference": args.reference,
            "reference_labels": args.reference_labels,
            "ref_includes_query": bool(args.ref_includes_query or args.reference is None),
            "num_queries": len(inputs.query),
            "metrics": list(compared),
            "bootstrap": bootstrap_settings(args),
            "knn": args.knn,
            "device": args.device or "cpu",
        },
        "versions": environment_versions(),
        "command": ["pml-eval", *getattr(args, "argv", [])],
    }
