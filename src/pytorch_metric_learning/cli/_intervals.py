"""Bootstrap intervals and their columns, shared by ``evaluate --ci`` and ``compare``.

The options themselves are defined in :mod:`pytorch_metric_learning.cli.parsers`."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ..evaluation import ConfidenceInterval, PerQueryValues, bootstrap_intervals
from ..evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from ._output import format_number

__all__ = [
    "interval_header",
    "interval_cell",
    "interval_note",
    "pop_intervals",
    "bootstrap_settings",
    "paper_recall",
]


def pop_intervals(metrics: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Remove ``"per_query"`` from ``metrics`` and bootstrap its metrics if ``--ci`` asks."""
    per_query = metrics.pop("per_query", None)
    if args.ci is None or not isinstance(per_query, PerQueryValues):
        return {}
    return bootstrap_intervals(
        per_query,
        args.ci,
        args.resamples,
        args.seed,
        by_class=args.ci_by_class,
        method=getattr(args, "ci_method", None) or "auto",
    )


def interval_note(intervals: dict[str, Any]) -> str:
    """Which metrics got which kind of interval, or ``""`` when all are bootstrap ones.

    Example:
        >>> interval_note({"recall_at_1": ConfidenceInterval(1.0, 0.9, 1.0, 0.95, "clopper_pearson")})
        'Intervals: exact binomial (Clopper-Pearson) for recall_at_1 (0 or 1 per query).'
    """
    exact = [name for name, found in intervals.items() if found.method == "clopper_pearson"]
    if not exact:
        return ""
    others = "; percentile bootstrap for the others" if len(exact) < len(intervals) else ""
    return (
        f"Intervals: exact binomial (Clopper-Pearson) for {', '.join(exact)} "
        f"(0 or 1 per query){others}."
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
        "method": getattr(args, "ci_method", None) or "auto",
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
