"""``pml-eval compare``: is model B better than model A on the same queries, beyond noise?

Both models' embeddings of the same queries are scored with the same metrics, and a
paired bootstrap over the queries (or, with ``--ci-by-class``, over whole classes) gives
the difference's interval and the one-sided p-value of "B is no better than A".
"""

from __future__ import annotations

import argparse
from typing import Any

from ..evaluation import PairedComparison, compare_per_query
from ..evaluation.retrieval.accuracy_calculator import ON_REQUEST_METRICS
from ._commands import COMMANDS
from ._errors import UsageError
from ._intervals import (
    add_bootstrap_arguments,
    bootstrap_settings,
    check_metric_names,
    check_seed,
)
from ._output import format_number, format_table, write_results
from ._paths import check_outputs
from ._specs import spec_option
from ._versions import environment_versions
from .evaluate import (
    EvaluationInputs,
    build_calculator,
    check_device,
    compute_metrics,
    load_inputs,
)

__all__ = ["COMPARED_METRICS", "add_parser", "run"]

# The k-NN metrics: each has a value per query, so each can be compared by bootstrap.
COMPARED_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
_KNOWN = tuple(sorted(COMPARED_METRICS + ON_REQUEST_METRICS))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand to ``pml-eval``'s subparsers."""
    parser = subparsers.add_parser(
        "compare",
        help=COMMANDS["compare"][1],
        description="Score model A's and model B's embeddings of the same queries, and report "
        "each metric for both, the difference B - A, its bootstrap interval, and the p-value "
        "of 'B is no better than A'. Without --reference, each query is searched among the "
        "other queries of the same model.",
    )
    parser.add_argument("a_query", metavar="A_QUERY", help="model A's query embeddings")
    parser.add_argument("b_query", metavar="B_QUERY", help="model B's query embeddings")
    parser.add_argument("--labels", required=True, metavar="FILE", help="labels of the queries")
    parser.add_argument(
        "--reference",
        nargs="+",
        metavar="FILE",
        help="embeddings to search in: A_REFERENCE B_REFERENCE (each model's own), or one "
        "file that both models' queries search",
    )
    parser.add_argument("--reference-labels", metavar="FILE", help="labels of the references")
    parser.add_argument(
        "--ref-includes-query",
        action="store_true",
        help="the first rows of each reference are its query; a query never retrieves itself",
    )
    parser.add_argument(
        "--metrics",
        type=_metric_names,
        default=COMPARED_METRICS,
        metavar="NAME,...",
        help=f"k-NN metrics to compare (default: {','.join(COMPARED_METRICS)}); also "
        f"{','.join(ON_REQUEST_METRICS)} and recall_at_K, precision_at_K, "
        "mean_average_precision_at_K, ndcg_at_K for any K",
    )
    parser.add_argument(
        "--device", type=check_device, help="torch device to compute on (default: cpu)"
    )
    parser.add_argument(
        "--knn", type=spec_option("--knn"), metavar="SPEC", help="k-NN backend: a name or JSON"
    )
    parser.add_argument("--output", metavar="FILE.json", help="write results as JSON ('-': stdout)")
    add_bootstrap_arguments(parser, ci_default=0.95)
    parser.set_defaults(run=run)


def _metric_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return check_metric_names(names, _KNOWN)


def run(args: argparse.Namespace) -> int:
    """Score both models, compare them, print a table and/or write JSON; return 0."""
    if (args.reference is None) != (args.reference_labels is None):
        raise UsageError("--reference and --reference-labels must be given together")
    if args.reference is not None and len(args.reference) > 2:
        raise UsageError(
            f"--reference takes one file or two (A's and B's). Got {len(args.reference)}"
        )
    check_seed(args)
    check_outputs({"--output": args.output}, _input_files(args))
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


def _input_files(args: argparse.Namespace) -> dict[str, str | None]:
    files = {"A_QUERY": args.a_query, "B_QUERY": args.b_query, "--labels": args.labels}
    for index, path in enumerate(args.reference or []):
        files[f"--reference ({index + 1})"] = path
    return {**files, "--reference-labels": args.reference_labels}


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
