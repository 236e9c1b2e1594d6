"""Bootstrap options and interval columns shared by ``evaluate --ci`` and ``compare``."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ..evaluation import ConfidenceInterval, PerQueryValues, bootstrap_intervals
from ..evaluation.retrieval._metric_names import describe_families, parse_metric_name
from ..evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from ._errors import UsageError
from ._output import format_number

__all__ = [
    "add_bootstrap_arguments",
    "ci_level",
    "check_metric_names",
    "check_seed",
    "interval_header",
    "interval_cell",
    "pop_intervals",
    "bootstrap_settings",
    "paper_recall",
]


def ci_level(text: str) -> float:
    """A confidence level given in percent, e.g. ``95``, as a fraction.

    Example:
        >>> ci_level("95")
        0.95
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 < value < 100:  # 0.95 is a fraction typed by mistake, not a 0.95% interval
        raise argparse.ArgumentTypeError(
            f"must be a percentage between 1 and 100, e.g. 95. Got {text!r} instead"
        )
    return value / 100


def _positive_int(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int. Got {text!r} instead")
    return value


def add_bootstrap_arguments(parser: argparse.ArgumentParser, ci_default: float | None) -> None:
    """``--ci``, ``--ci-by-class``, ``--resamples`` and ``--seed``."""
    default = "" if ci_default is None else f" (default: {ci_default * 100:g})"
    parser.add_argument(
        "--ci",
        type=ci_level,
        default=ci_default,
        metavar="PERCENT",
        help=f"percentile-bootstrap interval over queries at this level, e.g. 95{default}",
    )
    parser.add_argument(
        "--ci-by-class",
        action="store_true",
        help="resample whole classes instead of queries (queries of a class are correlated)",
    )
    parser.add_argument(
        "--resamples", type=_positive_int, default=1000, help="bootstrap resamples (default: 1000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")


def check_metric_names(names: tuple[str, ...], known: tuple[str, ...]) -> tuple[str, ...]:
    """Known names and ``recall_at_<K>``-style names pass; others are an argparse error."""
    unknown = [name for name in names if name not in known and parse_metric_name(name) is None]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown metric {unknown[0] if unknown else ''!r}; choose among "
            f"{', '.join(known)}, or {describe_families()}"
        )
    return names


def pop_intervals(metrics: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Remove ``"per_query"`` from ``metrics`` and bootstrap its metrics if ``--ci`` asks."""
    per_query = metrics.pop("per_query", None)
    if args.ci is None or not isinstance(per_query, PerQueryValues):
        return {}
    return bootstrap_intervals(
        per_query, args.ci, args.resamples, args.seed, by_class=args.ci_by_class
    )


def check_seed(args: argparse.Namespace) -> None:
    """``--seed`` seeds NumPy's generator, which takes no negative seed."""
    if args.seed < 0:
        raise UsageError(f"--seed must be a non-negative int. Got {args.seed} instead")


def check_ci_options(args: argparse.Namespace) -> None:
    """Intervals are of plain averages over queries: not per class, not of class averages."""
    check_seed(args)
    if args.ci is not None and (args.per_class or args.avg_of_avgs):
        raise UsageError(
            "--ci gives intervals of averages over queries; it cannot be combined with "
            "--per-class or --avg-of-avgs"
        )


def interval_header(level: float) -> str:
    return f"{level * 100:g}% interval"


def interval_cell(interval: ConfidenceInterval | Any) -> str:
    """``[low, high]`` with four decimals, or empty for a metric without an interval.

    Example:
        >>> interval_cell(ConfidenceInterval(0.5, 0.41, 0.59, 0.95))
        '[0.4100, 0.5900]'
    """
    if interval is None:
        return ""
    return f"[{format_number(interval.low)}, {format_number(interval.high)}]"


def bootstrap_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "level": args.ci,
        "resamples": args.resamples,
        "seed": args.seed,
        "resample": "classes" if args.ci_by_class else "queries",
    }


def paper_recall(
    embeddings: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 2, 4, 8)
) -> dict[str, ConfidenceInterval]:
    """Recall@K of self-retrieval (each query searched among the others) with 95% intervals,
    as papers report CUB-200 and Cars196.

    Example:
        >>> x, y = torch.randn(100, 4), torch.arange(100) % 5
        >>> list(paper_recall(x, y, ks=(1, 4)))
        ['recall_at_1', 'recall_at_4']
    """
    names = tuple(f"recall_at_{k}" for k in ks)
    calculator = AccuracyCalculator(include=names)
    results = calculator.get_accuracy(embeddings, labels, return_per_query=True)
    return bootstrap_intervals(results["per_query"], level=0.95, seed=0)
