"""``pml-eval evaluate``: retrieval and clustering metrics of embedding files."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidArgumentError
from ..evaluation import load_kmeans_func, load_knn_func
from ..evaluation.retrieval.accuracy_calculator import (
    DEFAULT_METRICS,
    ON_REQUEST_METRICS,
    AccuracyCalculator,
)
from ._commands import COMMANDS
from ._errors import UsageError
from ._intervals import (
    add_bootstrap_arguments,
    bootstrap_settings,
    check_ci_options,
    check_metric_names,
    interval_cell,
    interval_header,
    pop_intervals,
)
from ._output import format_table, write_results
from ._paths import check_outputs
from ._specs import describe_spec, spec_option
from ._versions import environment_versions
from .loaders import encode_labels, load_embeddings, read_labels

__all__ = ["EvaluationInputs", "load_inputs", "build_calculator", "add_parser", "run"]

logger = logging.getLogger(__name__)

KNOWN_METRICS = tuple(sorted(DEFAULT_METRICS + ON_REQUEST_METRICS))


@dataclass
class EvaluationInputs:
    """Everything read from the files, ready for ``AccuracyCalculator.get_accuracy``."""

    query: torch.Tensor
    query_labels: torch.Tensor
    reference: torch.Tensor | None
    reference_labels: torch.Tensor | None
    class_names: list[str] | None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``evaluate`` subcommand to ``pml-eval``'s subparsers."""
    parser = subparsers.add_parser(
        "evaluate",
        help=COMMANDS["evaluate"][1],
        description="Compute precision@1, R-precision, MAP@R, NMI, AMI, ... of embeddings. "
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
        "--metrics",
        type=_metric_names,
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
        "--device", type=check_device, help="torch device to compute on (default: cpu)"
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
    parser.set_defaults(run=run)


def _metric_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return check_metric_names(names, KNOWN_METRICS)


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


def load_inputs(args: argparse.Namespace) -> EvaluationInputs:
    """Read and cross-check the query, reference and label files named by ``args``."""
    if (args.reference is None) != (args.reference_labels is None):
        raise UsageError("--reference and --reference-labels must be given together")
    if args.ref_includes_query and args.reference is None:
        raise UsageError("--ref-includes-query needs --reference")
    query = load_embeddings(args.query)
    raw = [read_labels(args.labels, num_rows=len(query))]
    reference = None
    if args.reference is not None:
        reference = load_embeddings(args.reference)
        _check_widths(query, reference, args)
        raw.append(read_labels(args.reference_labels, num_rows=len(reference)))
    labels, names = encode_labels(*raw)
    reference_labels = labels[1] if reference is not None else None
    if reference is not None and reference.dtype != query.dtype:
        reference = reference.to(torch.promote_types(query.dtype, reference.dtype))
        query = query.to(reference.dtype)
    return EvaluationInputs(query, labels[0], reference, reference_labels, names)


def _check_widths(query: torch.Tensor, reference: torch.Tensor, args: argparse.Namespace) -> None:
    if query.shape[1] != reference.shape[1]:
        raise InvalidArgumentError(
            f"The embeddings in '{args.reference}' have {reference.shape[1]} columns but those "
            f"in '{args.query}' have {query.shape[1]}; query and reference must have the same "
            "width."
        )


def build_calculator(args: argparse.Namespace) -> AccuracyCalculator:
    """The ``AccuracyCalculator`` the command line describes."""
    return AccuracyCalculator(
        include=args.metrics,
        avg_of_avgs=args.avg_of_avgs,
        return_per_class=args.per_class,
        k=args.k,
        device=args.device,
        knn_func=_backend(args.knn, "--knn", load_knn_func),
        kmeans_func=_backend(args.kmeans, "--kmeans", load_kmeans_func),
    )


def _backend(spec: Any, option: str, load: Callable[[Any], Any]) -> Any:
    """Build the backend a spec names; a factory that rejects the options is a user error."""
    if spec is None:
        return None
    try:
        return load(spec)
    except TypeError as error:
        raise InvalidArgumentError(f"{option} {spec}: {error}") from error


def check_device(text: str) -> torch.device:
    """A torch device this machine can compute on (an argparse ``type``: else exit 2).

    Example:
        >>> check_device("cpu")
        device(type='cpu')
    """
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"must be a torch device such as cpu or cuda:0. Got {text!r} instead"
        ) from None
    problem = _device_problem(device)
    if problem:
        raise argparse.ArgumentTypeError(f"cannot compute on {text!r}: {problem}")
    return device


def _device_problem(device: torch.device) -> str:
    """Why ``device`` cannot hold the embeddings here, or ``""``."""
    if device.type == "meta":
        return "meta tensors have shapes but no values; use cpu or cuda"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine"
    if device.type in ("cpu", "cuda", "mps"):
        return ""
    try:
        torch.zeros(1, device=device)
    except Exception as error:  # any backend's own failure means "not usable here"
        return " ".join(str(error).split()) or type(error).__name__
    return ""


def run(args: argparse.Namespace) -> int:
    """Compute the metrics, print them as a table and/or write them as JSON; return 0."""
    check_outputs({"--output": args.output}, _input_files(args))
    check_ci_options(args)
    inputs = load_inputs(args)
    quiet = (
        contextlib.redirect_stdout(sys.stderr) if args.output == "-" else contextlib.nullcontext()
    )
    with quiet:  # what plugins print must not corrupt the JSON on stdout
        calculator = build_calculator(args)
        _log_setup(inputs, calculator)
        started = time.perf_counter()
        metrics = calculator.get_accuracy(
            inputs.query,
            inputs.query_labels,
            inputs.reference,
            inputs.reference_labels,
            ref_includes_query=args.ref_includes_query,
            return_per_query=args.ci is not None,
        )
    logger.info("Computed %d metric(s) in %.2f s", len(metrics), time.perf_counter() - started)
    intervals = pop_intervals(metrics, args)
    if args.output != "-":
        print(_describe_search(inputs, args))
        print(_render(metrics, inputs, args.ref_includes_query, intervals, args.ci))
        check = calculator.last_knn_check
        if check is not None and not check.exact:
            print(f"\nNote: these figures come from an {check.describe()}.")
    if args.output:
        write_results(args.output, _record(metrics, inputs, calculator, args, intervals))
    return 0


def _log_setup(inputs: EvaluationInputs, calculator: AccuracyCalculator) -> None:
    """What ``-v`` adds: what was read and which backends will run."""
    reference = inputs.query if inputs.reference is None else inputs.reference
    logger.info(
        "Read %d queries and %d references of %d dims (%s)",
        len(inputs.query),
        len(reference),
        inputs.query.shape[1],
        inputs.query.dtype,
    )
    logger.info(
        "k-NN backend: %r; k-means backend: %r", calculator.knn_func, calculator.kmeans_func
    )
    logger.info("k: %s; device: %s", calculator.k, calculator.device or inputs.query.device)


def _input_files(args: argparse.Namespace) -> dict[str, str | None]:
    return {
        "QUERY": args.query,
        "--labels": args.labels,
        "--reference": args.reference,
        "--reference-labels": args.reference_labels,
    }


def _describe_search(inputs: EvaluationInputs, args: argparse.Namespace) -> str:
    rows, dims = inputs.query.shape
    target = (
        "each other (leave-one-out)"
        if inputs.reference is None
        else f"{args.reference} ({len(inputs.reference)} rows"
        + (", starting with the query)" if args.ref_includes_query else ")")
    )
    return f"{args.query}: {rows} queries of {dims} dims searched in {target}\n"


def _render(
    metrics: dict[str, Any],
    inputs: EvaluationInputs,
    ref_includes_query: bool,
    intervals: dict[str, Any] | None = None,
    level: float | None = None,
) -> str:
    lists = {name: value for name, value in metrics.items() if isinstance(value, list)}
    scalars = [[name, value] for name, value in metrics.items() if name not in lists]
    header = ["metric", "value"]
    if intervals and level is not None:  # --ci: one more column
        header.append(interval_header(level))
        scalars = [[*row, interval_cell(intervals.get(row[0]))] for row in scalars]
    blocks = [format_table(header, scalars)] if scalars else []
    if lists:
        classes = _per_class_names(inputs, lists, ref_includes_query)
        rows = [
            [label, *(values[i] for values in lists.values())] for i, label in enumerate(classes)
        ]
        blocks.append(format_table(["class", *lists], rows))
    return "\n\n".join(blocks)


def _per_class_names(
    inputs: EvaluationInputs, lists: dict[str, list[float]], ref_includes_query: bool
) -> list[Any]:
    """Per-class values are ordered by label over the classes that have scored queries."""
    length = len(next(iter(lists.values())))
    scored = _scored_classes(inputs, ref_includes_query)
    return scored if len(scored) == length else [f"#{i}" for i in range(length)]


def _scored_classes(inputs: EvaluationInputs, ref_includes_query: bool) -> list[Any]:
    """Labels of the queries that have at least one same-label reference (not themselves)."""
    query = inputs.query_labels.numpy()
    reference = query if inputs.reference_labels is None else inputs.reference_labels.numpy()
    leave_one_out = ref_includes_query or inputs.reference_labels is None
    values, counts = np.unique(reference, return_counts=True)
    available = values[counts > (1 if leave_one_out else 0)]
    numbers = np.intersect1d(np.unique(query), available)
    names = inputs.class_names
    return [names[n] if names else int(n) for n in numbers.tolist()]


def _search_check(calculator: AccuracyCalculator) -> dict[str, Any]:
    """``exact`` and, for an approximate backend, the recall its spot-check measured."""
    check = getattr(calculator, "last_knn_check", None)
    if check is None:
        return {}
    found: dict[str, Any] = {"exact": check.exact}
    if not check.exact:
        found["approximate"] = {**check.as_dict(), "note": check.describe()}
    return found


def _record(
    metrics: dict[str, Any],
    inputs: EvaluationInputs,
    calculator: AccuracyCalculator,
    args: argparse.Namespace,
    intervals: dict[str, Any] | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {"metrics": metrics}
    if intervals:
        record["intervals"] = {name: value.as_dict() for name, value in intervals.items()}
    if any(isinstance(value, list) for value in metrics.values()):
        record["classes"] = _scored_classes(inputs, args.ref_includes_query)
    record["settings"] = {
        "query": args.query,
        "labels": args.labels,
        "reference": args.reference,
        "reference_labels": args.reference_labels,
        "ref_includes_query": bool(args.ref_includes_query or args.reference is None),
        "num_queries": len(inputs.query),
        "num_references": len(inputs.query if inputs.reference is None else inputs.reference),
        "dims": int(inputs.query.shape[1]),
        "metrics": list(metrics),
        "k": calculator.k,
        "avg_of_avgs": calculator.avg_of_avgs,
        "per_class": calculator.return_per_class,
        "bootstrap": bootstrap_settings(args) if args.ci is not None else None,
        "device": str(calculator.device or inputs.query.device),
        "knn": {
            **describe_spec(args.knn, "knn", "custom"),
            "repr": repr(calculator.knn_func),
            **_search_check(calculator),
        },
        "kmeans": {
            **describe_spec(args.kmeans, "kmeans", "torch"),
            "repr": repr(calculator.kmeans_func),
        },
    }
    record["versions"] = environment_versions()
    record["command"] = ["pml-eval", *getattr(args, "argv", [])]
    return record
