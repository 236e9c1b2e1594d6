"""``pml-eval evaluate``: retrieval and clustering metrics of embedding files."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidArgumentError
from ..evaluation import load_kmeans_func, load_knn_func
from ..evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from ._breakdowns import (
    category_counts,
    category_record,
    draw_worst,
    read_categories,
    read_worst_images,
    render_categories,
    render_worst,
    reusable_per_query,
    worst_queries,
    worst_record,
)
from ._errors import UsageError
from ._intervals import (
    bootstrap_settings,
    interval_cell,
    interval_header,
    interval_note,
    pop_intervals,
)
from ._label_values import check_label_value_options, encoded_label_values, label_value_texts
from ._output import format_table, write_results
from ._paths import check_outputs
from ._specs import describe_spec
from ._versions import environment_versions
from .loaders import (
    check_one_stdin,
    encode_labels,
    group_role,
    load_embeddings,
    read_label_like,
    read_labels,
)
from .parsers._common import check_ci_options
from .parsers.evaluate import check_reference_options, input_files, output_files

__all__ = [
    "EvaluationInputs",
    "load_inputs",
    "build_calculator",
    "check_device",
    "resolve_device",
    "compute_metrics",
    "run",
]

logger = logging.getLogger(__name__)

# Appended to the name of a metric the table shows but --k made wrong.
WRONG_MARK = " (!)"


@dataclass
class EvaluationInputs:
    """Everything read from the files, ready for ``AccuracyCalculator.get_accuracy``."""

    query: torch.Tensor
    query_labels: torch.Tensor
    reference: torch.Tensor | None
    reference_labels: torch.Tensor | None
    class_names: list[str] | None
    query_categories: list[Any] | None = None
    query_groups: torch.Tensor | None = None
    reference_groups: torch.Tensor | None = None
    single_gallery_shot: bool = False
    junk_labels: tuple[int, ...] = ()
    distractor_labels: tuple[int, ...] = ()

    def protocol(self) -> dict[str, Any]:
        """The protocol arguments of ``get_accuracy`` (and of every view of its per-query
        results, e.g. the worst queries): one source, so all use the same candidates."""
        return {
            "query_groups": self.query_groups,
            "reference_groups": self.reference_groups,
            "junk_labels": self.junk_labels,
            "distractor_labels": self.distractor_labels,
            "single_gallery_shot": self.single_gallery_shot,
        }


def load_inputs(args: argparse.Namespace) -> EvaluationInputs:
    """Read and cross-check the query, reference and label files named by ``args``."""
    check_reference_options(args)
    check_label_value_options(args)
    check_one_stdin(input_files(args))
    query = load_embeddings(args.query)
    raw = [read_labels(args.labels, num_rows=len(query))]
    reference = None
    if args.reference is not None:
        reference = load_embeddings(args.reference, keep_float16=_streams_float16(args, query))
        _check_widths(query, reference, args)
        raw.append(read_labels(args.reference_labels, num_rows=len(reference)))
    labels, names = encode_labels(*raw)
    reference_labels = labels[1] if reference is not None else None
    if args.ref_includes_query and reference is not None and reference_labels is not None:
        _check_query_leads(query, labels[0], reference, reference_labels, args)
    if reference is not None and reference.dtype not in (query.dtype, torch.float16):
        reference = reference.to(torch.promote_types(query.dtype, reference.dtype))
        query = query.to(reference.dtype)
    categories = read_categories(getattr(args, "query_categories", None), len(query))
    inputs = EvaluationInputs(query, labels[0], reference, reference_labels, names, categories)
    inputs.query_groups, inputs.reference_groups = _load_groups(args, len(query), reference)
    inputs.single_gallery_shot = bool(getattr(args, "single_gallery_shot", False))
    inputs.junk_labels = encoded_label_values(args, "junk_labels", names)
    inputs.distractor_labels = encoded_label_values(args, "distractor_labels", names)
    return inputs


def _streams_float16(args: argparse.Namespace, query: torch.Tensor) -> bool:
    """Whether a float16 ``.npy`` reference stays float16 on its memory mapping: the exact
    ``custom`` search on the CPU converts each block to float32 as it searches it (exactly,
    so the results are those of the float32 values). Other backends and devices, and a
    float64 query, get the reference converted."""
    spec = getattr(args, "knn", None)
    name = spec.get("name") if isinstance(spec, dict) else spec
    device = getattr(args, "device", None)
    cpu = device is None or str(device) == "cpu"
    return cpu and name in (None, "custom") and query.dtype == torch.float32


def _load_groups(
    args: argparse.Namespace, num_query: int, reference: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``--query-groups`` and ``--reference-groups``, numbered together like labels."""
    query_file = getattr(args, "query_groups", None)
    if query_file is None:
        return None, None
    raw = [_read_groups(query_file, "--query-groups", num_query)]
    if reference is not None:
        raw.append(_read_groups(args.reference_groups, "--reference-groups", len(reference)))
        _check_group_kinds(raw[0], raw[1])
    groups, _ = encode_labels(*raw)
    if reference is not None:
        _warn_if_no_shared_group(groups[0], groups[1])
    return groups[0], groups[1] if reference is not None else None


# The library's own warning for groups that never meet, which names its arguments; the
# command line says it in terms of its options instead (_warn_if_no_shared_group).
_LIBRARY_NO_SHARED_GROUP = "No query group occurs among the reference groups"


def _warn_if_no_shared_group(query: torch.Tensor, reference: torch.Tensor) -> None:
    """Group files whose ids never meet exclude nothing: say so, naming the options."""
    if not bool(torch.isin(query, reference).any()):
        warnings.warn(
            "No group id of --query-groups occurs in --reference-groups, so the same-group "
            "rule excludes nothing; check that both files number the groups (cameras) alike.",
            stacklevel=2,
        )


def _read_groups(source: str, option: str, num_rows: int) -> np.ndarray:
    """One group file: integer ids or names (errors name the option, not "labels")."""
    return read_label_like(source, num_rows, group_role(option))


def _check_group_kinds(query: np.ndarray, reference: np.ndarray) -> None:
    """Integer ids in one group file and names in the other would never match (``1`` is
    not ``"cam1"``), silently switching the camera rule off: refuse the mix."""
    kinds = ["names" if array.dtype.kind in "US" else "integers" for array in (query, reference)]
    if kinds[0] != kinds[1]:
        raise InvalidArgumentError(
            f"The --query-groups and --reference-groups files must both hold integers or both "
            f"hold names. Got {kinds[0]} in --query-groups and {kinds[1]} in "
            "--reference-groups instead."
        )


def _check_widths(query: torch.Tensor, reference: torch.Tensor, args: argparse.Namespace) -> None:
    if query.shape[1] != reference.shape[1]:
        raise InvalidArgumentError(
            f"The embeddings in '{args.reference}' have {reference.shape[1]} columns but those "
            f"in '{args.query}' have {query.shape[1]}; query and reference must have the same "
            "width."
        )


def _check_query_leads(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    reference: torch.Tensor,
    reference_labels: torch.Tensor,
    args: argparse.Namespace,
) -> None:
    """``--ref-includes-query``: the reference file starts with the query's rows and labels
    (compared as the values searched: a float16 reference as its float32 values)."""
    num = len(query)
    same_rows = len(reference) >= num and torch.equal(
        reference[:num].to(torch.float64), query.to(torch.float64)
    )
    if not (same_rows and torch.equal(reference_labels[:num], query_labels)):
        raise InvalidArgumentError(
            f"--ref-includes-query says the first {num} rows of '{args.reference}' (and of "
            f"'{args.reference_labels}') are the query's, but they differ from '{args.query}' "
            f"(or '{args.labels}'). Put the query's rows first in the reference, or leave out "
            "--ref-includes-query."
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


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``--device`` as a ``torch.device`` this machine can compute on; else exit 2.

    Example:
        >>> resolve_device("cpu"), resolve_device(None)
        (device(type='cpu'), None)
    """
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return check_device(device)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"argument --device: {error}") from None


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
    check_outputs(output_files(args), input_files(args))
    check_ci_options(args)
    args.device = resolve_device(args.device)
    inputs = load_inputs(args)
    images = read_worst_images(args, inputs)
    quiet = (
        contextlib.redirect_stdout(sys.stderr) if args.output == "-" else contextlib.nullcontext()
    )
    small_k = _SmallK()
    calculator_logger = logging.getLogger(AccuracyCalculator.__module__)
    calculator_logger.addFilter(small_k)
    try:
        with quiet, warnings.catch_warnings():  # plugins' prints must not corrupt the JSON
            warnings.filterwarnings("ignore", message=_LIBRARY_NO_SHARED_GROUP)
            calculator = build_calculator(args)
            _log_setup(inputs, calculator)
            started = time.perf_counter()
            metrics = compute_metrics(
                calculator,
                inputs,
                args.ref_includes_query,
                args.ci is not None or inputs.query_categories is not None or bool(args.show_worst),
            )
    finally:
        calculator_logger.removeFilter(small_k)
    logger.info("Computed %d metric(s) in %.2f s", len(metrics), time.perf_counter() - started)
    small_k.warn()
    per_query = metrics.get("per_query")
    intervals = pop_intervals(metrics, args)
    per_category = metrics.pop("per_category", None)
    counts = None
    if per_category is not None and per_query is not None:
        categories = inputs.query_categories or []
        # without a k-NN metric no query is left out (clustering uses every query)
        scored = per_query.query_indices.tolist() if per_query.values else range(len(categories))
        counts = category_counts(categories, scored)
    worst = None
    if args.show_worst:
        with warnings.catch_warnings():  # said once, in the options' terms, when read
            warnings.filterwarnings("ignore", message=_LIBRARY_NO_SHARED_GROUP)
            reused = reusable_per_query(calculator, per_query, args.worst_metric)
            worst = worst_queries(args, inputs, calculator.knn_func, reused)
    if args.output != "-":
        print(_describe_search(inputs, args))
        print(_render(metrics, inputs, args.ref_includes_query, intervals, args.ci, small_k.names))
        if intervals and interval_note(intervals):
            print(interval_note(intervals))
        if per_category is not None and counts is not None:
            print("\n" + render_categories(per_category, counts, small_k.names))
        if worst is not None:
            print("\n" + render_worst(worst, args.worst_metric, inputs.class_names))
        check = calculator.last_knn_check
        if check is not None and not check.exact:
            print(f"\nNote: these figures come from an {check.describe()}.")
    if worst is not None and images is not None:
        draw_worst(args, worst, images, inputs.class_names)
    if args.output:
        record = _record(metrics, inputs, calculator, args, intervals)
        if per_category is not None:
            record["per_category"] = category_record(per_category)
            record.update(counts.as_record() if counts is not None else {})
        if worst is not None:
            record["worst_queries"] = worst_record(
                worst, args.worst_metric, inputs.class_names, args.worst_k
            )
        write_results(args.output, record)
    return 0


def compute_metrics(
    calculator: AccuracyCalculator,
    inputs: EvaluationInputs,
    ref_includes_query: bool,
    return_per_query: bool,
    single_gallery_shot: bool = False,
) -> dict[str, Any]:
    """``calculator.get_accuracy`` on what was read from the files (under their protocol;
    ``single_gallery_shot`` also turns it on)."""
    protocol = inputs.protocol()
    protocol["single_gallery_shot"] = protocol["single_gallery_shot"] or single_gallery_shot
    return calculator.get_accuracy(
        inputs.query,
        inputs.query_labels,
        inputs.reference,
        inputs.reference_labels,
        ref_includes_query=ref_includes_query,
        return_per_query=return_per_query,
        query_categories=inputs.query_categories,
        **protocol,
    )


class _SmallK(logging.Filter):
    """Catches the calculator's "k below the max bin count" record, worded for Python
    callers (``k='max_bin_count'``), so that the CLI says it in its own terms, once, and
    marks the metrics it names in the table."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.k = 0
        self.max_bin_count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.funcName != "_log_small_k" or not isinstance(record.args, tuple):
            return True
        names, k, max_bin_count = record.args
        self.k, self.max_bin_count = int(k), int(max_bin_count)  # type: ignore[call-overload]
        self.names += [str(name) for name in names if name not in self.names]  # type: ignore[attr-defined]
        return False

    def warn(self) -> None:
        if not self.names:
            return
        print(
            f"pml-eval: warning: --k {self.k} is below the size of the largest class "
            f"({self.max_bin_count} relevant references), so {', '.join(self.names)} are "
            f"wrong (marked {WRONG_MARK.strip()} in the table). Use --k max_bin_count or --k all.",
            file=sys.stderr,
        )


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
    wrong: Sequence[str] = (),
) -> str:
    """The metrics as tables; those in ``wrong`` are marked, with a note under the table."""
    lists = {_marked(n, wrong): v for n, v in metrics.items() if isinstance(v, list)}
    scalars = [
        [_marked(name, wrong), value]
        for name, value in metrics.items()
        if not isinstance(value, list)
    ]
    header = ["metric", "value"]
    if intervals and level is not None:  # --ci: one more column
        header.append(interval_header(level))
        scalars = [
            [*row, interval_cell(intervals.get(str(row[0]).removesuffix(WRONG_MARK)))]
            for row in scalars
        ]
    blocks = [format_table(header, scalars)] if scalars else []
    if lists:
        classes = _per_class_names(inputs, lists, ref_includes_query)
        rows = [
            [label, *(values[i] for values in lists.values())] for i, label in enumerate(classes)
        ]
        blocks.append(format_table(["class", *lists], rows))
    if wrong:
        blocks.append(f"{WRONG_MARK.strip()} wrong: --k is below the largest class's size")
    return "\n\n".join(blocks)


def _marked(name: str, wrong: Sequence[str]) -> str:
    return f"{name}{WRONG_MARK}" if name in wrong else name


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
        "query_categories": getattr(args, "query_categories", None),
        "query_groups": getattr(args, "query_groups", None),
        "reference_groups": getattr(args, "reference_groups", None),
        "single_gallery_shot": bool(getattr(args, "single_gallery_shot", False)),
        "junk_labels": label_value_texts(args, "junk_labels"),
        "distractor_labels": label_value_texts(args, "distractor_labels"),
        "queries_left_out": calculator.last_num_queries_left_out,
        "ref_includes_query": bool(args.ref_includes_query or args.reference is None),
        "num_queries": len(inputs.query),
        "num_references": len(inputs.query if inputs.reference is None else inputs.reference),
        "dims": int(inputs.query.shape[1]),
        "metrics": list(metrics),
        "k": calculator.k,
        "avg_of_avgs": calculator.avg_of_avgs,
        "per_class": calculator.return_per_class,
        "bootstrap": bootstrap_settings(args) if args.ci is not None else None,
        "show_worst": getattr(args, "show_worst", None),
        "worst_metric": getattr(args, "worst_metric", None)
        if getattr(args, "show_worst", None)
        else None,
        "worst_k": getattr(args, "worst_k", None) if getattr(args, "show_worst", None) else None,
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
