"""The options of ``pml-eval compare`` (the work: :mod:`pytorch_metric_learning.cli.compare`)."""

from __future__ import annotations

import argparse

from ..._metric_catalog import ON_REQUEST_METRICS
from .._errors import UsageError
from .._paths import check_outputs
from .._specs import spec_option
from ._common import Deferred, add_bootstrap_arguments, add_command, device_name, metric_names

__all__ = ["COMPARED_METRICS", "add_parser", "check_references", "input_files"]

# The k-NN metrics: each has a value per query, so each can be compared by bootstrap.
COMPARED_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
_KNOWN = tuple(sorted(COMPARED_METRICS + ON_REQUEST_METRICS))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand to ``pml-eval``'s subparsers."""
    parser = add_command(
        subparsers,
        "compare",
        "Score model A's and model B's embeddings of the same queries, and report "
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
        type=metric_names(_KNOWN),
        default=COMPARED_METRICS,
        metavar="NAME,...",
        help=f"k-NN metrics to compare (default: {','.join(COMPARED_METRICS)}); also "
        f"{','.join(ON_REQUEST_METRICS)} and recall_at_K, precision_at_K, "
        "mean_average_precision_at_K, ndcg_at_K for any K",
    )
    parser.add_argument(
        "--device", type=device_name, help="torch device to compute on (default: cpu)"
    )
    parser.add_argument(
        "--knn", type=spec_option("--knn"), metavar="SPEC", help="k-NN backend: a name or JSON"
    )
    parser.add_argument("--output", metavar="FILE.json", help="write results as JSON ('-': stdout)")
    add_bootstrap_arguments(parser, ci_default=0.95)
    parser.set_defaults(run=Deferred("compare", (check_references, _outputs)))


def check_references(args: argparse.Namespace) -> None:
    """``--reference`` (one file or two) comes with ``--reference-labels``."""
    if (args.reference is None) != (args.reference_labels is None):
        raise UsageError("--reference and --reference-labels must be given together")
    if args.reference is not None and len(args.reference) > 2:
        raise UsageError(
            f"--reference takes one file or two (A's and B's). Got {len(args.reference)}"
        )


def input_files(args: argparse.Namespace) -> dict[str, str | None]:
    """The files ``compare`` reads, by option name."""
    files = {"A_QUERY": args.a_query, "B_QUERY": args.b_query, "--labels": args.labels}
    for index, path in enumerate(args.reference or []):
        files[f"--reference ({index + 1})"] = path
    return {**files, "--reference-labels": args.reference_labels}


def _outputs(args: argparse.Namespace) -> None:
    check_outputs({"--output": args.output}, input_files(args))
