"""The options of ``pml-eval evaluate`` (the work: :mod:`pytorch_metric_learning.cli.evaluate`)."""

from __future__ import annotations

import argparse

from ..._metric_catalog import DEFAULT_METRICS, ON_REQUEST_METRICS
from .._errors import UsageError
from .._paths import check_outputs
from .._specs import spec_option
from ._common import (
    Deferred,
    add_bootstrap_arguments,
    add_command,
    check_ci_options,
    device_name,
    metric_names,
)

__all__ = ["KNOWN_METRICS", "add_parser", "check_reference_options", "input_files"]

KNOWN_METRICS = tuple(sorted(DEFAULT_METRICS + ON_REQUEST_METRICS))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``evaluate`` subcommand to ``pml-eval``'s subparsers."""
    parser = add_command(
        subparsers,
        "evaluate",
        "Compute precision@1, R-precision, MAP@R, NMI, AMI, ... of embeddings. "
        "Without --reference, each query is searched among the other queries.",
    )
    parser.add_argument("query", metavar="QUERY", help="query embeddings (.npy, .npz, .pt, .csv)")
    parser.add_argument("--labels", required=True, metavar="FILE", help="labels of QUERY")
    parser.add_argument("--reference", metavar="FILE", help="embeddings to search in")
    parser.add_argument("--reference-labels", metavar="FILE", help="labels of --reference")
    parser.add_argument(
        "--ref-includes-query",
        action="store_true",
        help="the first rows of --reference are QUERY; a query never retrieves itself",
    )
    parser.add_argument(
        "--query-groups",
        metavar="FILE",
        help="a group id (e.g. camera) per query, same formats as --labels: a reference with "
        "the query's label and group is not a candidate (re-identification protocol); "
        "without --reference it covers both roles",
    )
    parser.add_argument("--reference-groups", metavar="FILE", help="a group id per --reference row")
    parser.add_argument(
        "--metrics",
        type=metric_names(KNOWN_METRICS),
        default=(),
        metavar="NAME,...",
        help=f"metrics to compute (default: {','.join(DEFAULT_METRICS)}); "
        f"also {','.join(ON_REQUEST_METRICS)} and recall_at_K, precision_at_K, "
        "mean_average_precision_at_K, ndcg_at_K for any K, e.g. recall_at_1,recall_at_4",
    )
    parser.add_argument(
        "--k",
        type=_k_value,
        default=None,
        metavar="K",
        help="neighbours to retrieve: an int, max_bin_count, or all (default: what the "
        "metrics need)",
    )
    parser.add_argument(
        "--device", type=device_name, help="torch device to compute on (default: cpu)"
    )
    parser.add_argument(
        "--knn",
        type=spec_option("--knn"),
        metavar="SPEC",
        help='k-NN backend: a name or JSON, e.g. \'{"name": "custom"}\'',
    )
    parser.add_argument(
        "--kmeans",
        type=spec_option("--kmeans"),
        metavar="SPEC",
        help="k-means backend: a name or JSON",
    )
    averaging = parser.add_mutually_exclusive_group()
    averaging.add_argument("--per-class", action="store_true", help="report k-NN metrics per class")
    averaging.add_argument(
        "--avg-of-avgs", action="store_true", help="average per class, then over classes"
    )
    parser.add_argument("--output", metavar="FILE.json", help="write results as JSON ('-': stdout)")
    add_bootstrap_arguments(parser, ci_default=None)
    parser.set_defaults(
        run=Deferred("evaluate", (check_reference_options, check_ci_options, _outputs))
    )


def _k_value(text: str) -> int | str | None:
    if text in ("all", "none", "None"):
        return None
    if text == "max_bin_count":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive int, max_bin_count or all. Got {text!r} instead"
        )
    return value


def check_reference_options(args: argparse.Namespace) -> None:
    """``--reference`` comes with its labels, and ``--ref-includes-query`` needs it."""
    if (args.reference is None) != (args.reference_labels is None):
        raise UsageError("--reference and --reference-labels must be given together")
    if args.ref_includes_query and args.reference is None:
        raise UsageError("--ref-includes-query needs --reference")
    query_groups = getattr(args, "query_groups", None)
    reference_groups = getattr(args, "reference_groups", None)
    if reference_groups is not None and args.reference is None:
        raise UsageError("--reference-groups needs --reference (else --query-groups covers both)")
    if args.reference is not None and (query_groups is None) != (reference_groups is None):
        raise UsageError("--query-groups and --reference-groups must be given together")


def input_files(args: argparse.Namespace) -> dict[str, str | None]:
    """The files ``evaluate`` reads, by option name."""
    return {
        "QUERY": args.query,
        "--labels": args.labels,
        "--reference": args.reference,
        "--reference-labels": args.reference_labels,
        "--query-groups": getattr(args, "query_groups", None),
        "--reference-groups": getattr(args, "reference_groups", None),
    }


def _outputs(args: argparse.Namespace) -> None:
    check_outputs({"--output": args.output}, input_files(args))
