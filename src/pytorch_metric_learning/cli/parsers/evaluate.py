"""The options of ``pml-eval evaluate`` (the work: :mod:`pytorch_metric_learning.cli.evaluate`)."""

from __future__ import annotations

import argparse

from ..._metric_catalog import DEFAULT_METRICS, ON_REQUEST_METRICS, zero_one_by_definition
from .._errors import UsageError
from .._label_values import check_label_value_options
from .._paths import check_outputs
from .._specs import spec_option
from ._common import (
    Deferred,
    add_bootstrap_arguments,
    add_command,
    check_ci_options,
    check_metric_names,
    device_name,
    metric_names,
    positive_int,
)

__all__ = [
    "KNOWN_METRICS",
    "add_parser",
    "check_breakdown_options",
    "check_ci_method",
    "check_single_shot",
    "check_reference_options",
    "input_files",
    "output_files",
]

KNOWN_METRICS = tuple(sorted(DEFAULT_METRICS + ON_REQUEST_METRICS))
# bootstrap.METHODS, spelled out: the parsers import no torch (pml-eval --help stays fast).
CI_METHODS = ("auto", "percentile", "clopper_pearson")

# --show-worst's table and picture when --worst-metric and --worst-k are not given
WORST_METRIC = "precision_at_1"
WORST_K = 5


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
        "--junk-labels",
        nargs="+",
        metavar="LABEL",
        help="reference labels that are never a candidate (Market-1501: -1), read like the "
        "labels of --labels (integers, or names for name labels); the API's junk_labels",
    )
    parser.add_argument(
        "--distractor-labels",
        nargs="+",
        metavar="LABEL",
        help="reference labels that are candidates but never relevant (Market-1501: 0), read "
        "like --junk-labels (no label in both); the API's distractor_labels",
    )
    parser.add_argument(
        "--single-gallery-shot",
        action="store_true",
        help="torchreid's CUHK03 single-gallery-shot CMC: recall_at_K and precision_at_1 over "
        "one candidate per identity drawn at random, as the exact expectation over the draws "
        "(ranks every candidate); the other metrics stay over all candidates",
    )
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
    parser.add_argument(
        "--query-categories",
        metavar="FILE",
        help="a category per query (same formats as --labels, e.g. a product's "
        "super-category): every metric is also reported per category",
    )
    add_bootstrap_arguments(parser, ci_default=None)
    parser.add_argument(
        "--ci-method",
        choices=CI_METHODS,
        default=None,
        help="how --ci makes intervals: auto (default) gives metrics that are 0 or 1 per "
        "query by definition (recall_at_K, precision_at_1) the exact binomial Clopper-Pearson interval and "
        "the others the percentile bootstrap (so do all metrics under --single-gallery-shot, "
        "whose per-query values are expectations); or one method for all (clopper_pearson "
        "only when every metric is recall_at_K or precision_at_1, without --ci-by-class or "
        "--single-gallery-shot)",
    )
    _add_worst_arguments(parser)
    parser.set_defaults(
        run=Deferred(
            "evaluate",
            (
                check_reference_options,
                check_label_value_options,
                check_ci_options,
                check_ci_method,
                check_single_shot,
                check_breakdown_options,
                _outputs,
            ),
        )
    )


def _add_worst_arguments(parser: argparse.ArgumentParser) -> None:
    """``--show-worst`` and the options of its table and picture."""
    parser.add_argument(
        "--show-worst",
        type=positive_int,
        metavar="N",
        help="list the N queries with the lowest --worst-metric, with their top --worst-k "
        "retrievals and nearest relevant item",
    )
    parser.add_argument(
        "--worst-metric",
        type=_per_query_metric,
        metavar="NAME",
        help="the metric that ranks queries for --show-worst (default: precision_at_1)",
    )
    parser.add_argument(
        "--worst-k",
        type=positive_int,
        metavar="K",
        help="retrievals shown per worst query (default: 5)",
    )
    parser.add_argument(
        "--images",
        metavar="FILE",
        help="image paths of QUERY's rows, one per line (relative paths are relative to "
        "FILE's folder); with --plot",
    )
    parser.add_argument(
        "--reference-images",
        metavar="FILE",
        help="image paths of --reference's rows, one per line; with --images",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw the worst queries and their retrievals"
    )


def _per_query_metric(text: str) -> str:
    name = check_metric_names((text.strip(),), KNOWN_METRICS)[0]
    if name in ("NMI", "AMI"):
        raise argparse.ArgumentTypeError(
            f"must be a k-NN metric with a value per query, not {name!r}"
        )
    return name


def check_breakdown_options(args: argparse.Namespace) -> None:
    """``--query-categories`` and the worst-query options go with what they need."""
    if args.query_categories is not None and args.per_class:
        raise UsageError(
            "--query-categories reports each metric per category; it cannot be combined "
            "with --per-class"
        )
    if args.show_worst is None:
        given = [
            option
            for option, value in (
                ("--worst-metric", args.worst_metric),
                ("--worst-k", args.worst_k),
                ("--images", args.images),
                ("--reference-images", args.reference_images),
                ("--plot", args.plot),
            )
            if value is not None
        ]
        if given:
            raise UsageError(f"{given[0]} belongs to --show-worst N; give --show-worst")
        return
    args.worst_metric = args.worst_metric or WORST_METRIC
    args.worst_k = args.worst_k or WORST_K
    if (args.images is None) != (args.plot is None):
        raise UsageError("--images and --plot must be given together (the picture needs both)")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot writes a PNG; its file name must end in .png, not {args.plot!r}")
    if args.reference_images is not None and (args.images is None or args.reference is None):
        raise UsageError("--reference-images needs --images and --reference")
    if args.images is not None and args.reference is not None and args.reference_images is None:
        raise UsageError("--reference-images is needed to draw the retrievals from --reference")


def check_single_shot(args: argparse.Namespace) -> None:
    """``--single-gallery-shot`` changes recall_at_K and precision_at_1 of one process's
    search: refused with a sharded search, and pointless without those metrics."""
    if not getattr(args, "single_gallery_shot", False):
        return
    spec = getattr(args, "knn", None)
    name = spec.get("name") if isinstance(spec, dict) else spec
    if name == "torch_distributed":
        raise UsageError(
            "--single-gallery-shot cannot be combined with --knn torch_distributed: the "
            "single-shot draw ranks every candidate of a query in one process"
        )
    chosen = args.metrics or DEFAULT_METRICS
    if not any(_zero_one(name) for name in chosen):
        raise UsageError(
            "--single-gallery-shot changes only recall_at_K and precision_at_1, and --metrics "
            f"selects neither ({', '.join(chosen)}): add one, or leave out --single-gallery-shot"
        )


def check_ci_method(args: argparse.Namespace) -> None:
    """``--ci-method`` needs ``--ci``; ``clopper_pearson`` needs metrics that are 0 or 1 per
    query and independent queries, checked here so that no search runs for nothing."""
    method = getattr(args, "ci_method", None)
    if method is None:
        return
    if args.ci is None:
        raise UsageError("--ci-method chooses how --ci makes intervals; it needs --ci")
    if method != "clopper_pearson":
        return
    if getattr(args, "single_gallery_shot", False):
        raise UsageError(
            "--ci-method clopper_pearson cannot be combined with --single-gallery-shot: its "
            "per-query recall_at_K and precision_at_1 are expectations between 0 and 1 (over "
            "the single-shot draws), not 0/1 outcomes, so a binomial interval does not apply "
            "(use --ci-method auto or percentile: the percentile bootstrap)"
        )
    if args.ci_by_class:
        raise UsageError(
            "--ci-method clopper_pearson assumes independent queries; it cannot be combined "
            "with --ci-by-class (use --ci-method auto or percentile)"
        )
    chosen = args.metrics or DEFAULT_METRICS
    other = [name for name in chosen if name not in ("AMI", "NMI") and not _zero_one(name)]
    if other:
        raise UsageError(
            f"--ci-method clopper_pearson needs metrics that are 0 or 1 per query "
            f"(recall_at_K, precision_at_1); {', '.join(other)} "
            f"{'is' if len(other) == 1 else 'are'} not (choose --metrics among those, or "
            "use --ci-method auto, which gives the others the percentile bootstrap)"
        )


def _zero_one(name: str) -> bool:
    """Whether a metric's per-query values are 0 or 1 by its definition."""
    return zero_one_by_definition(name)


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
        "--query-categories": getattr(args, "query_categories", None),
        "--images": getattr(args, "images", None),
        "--reference-images": getattr(args, "reference_images", None),
        "--query-groups": getattr(args, "query_groups", None),
        "--reference-groups": getattr(args, "reference_groups", None),
    }


def output_files(args: argparse.Namespace) -> dict[str, str | None]:
    """The files ``evaluate`` writes, by option name."""
    return {"--output": args.output, "--plot": args.plot}


def _outputs(args: argparse.Namespace) -> None:
    check_outputs(output_files(args), input_files(args))
