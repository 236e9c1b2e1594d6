"""The options of ``pml-eval threshold`` (the work: :mod:`pytorch_metric_learning.cli.threshold`)."""

from __future__ import annotations

import argparse

from .._paths import check_outputs
from ._common import Deferred, add_command

__all__ = ["TAR_AT_FAR", "METRIC_NAMES", "metric_name", "add_parser"]

METRIC_NAMES = ("f1", "accuracy", "balanced_accuracy")
TAR_AT_FAR = "tar@far="


def metric_name(text: str) -> str:
    """The canonical name of a threshold metric: ``f1``, ``accuracy``,
    ``balanced_accuracy`` or ``tar@far=RATE`` with ``RATE`` a fraction or a percentage.

    Example:
        >>> metric_name("TAR@FAR=1%")
        'tar@far=0.01'
    """
    name = text.strip().lower()
    if name in METRIC_NAMES:
        return name
    if name.startswith(TAR_AT_FAR):
        rate = _rate(name[len(TAR_AT_FAR) :])
        if rate is not None:
            return f"{TAR_AT_FAR}{rate!r}"
    raise argparse.ArgumentTypeError(
        f"must be f1, accuracy, balanced_accuracy or tar@far=RATE with RATE between 0 and 1 "
        f"(or 0% and 100%). Got {text!r} instead"
    )


def _rate(text: str) -> float | None:
    percent = text.endswith("%")
    try:
        rate = float(text[:-1] if percent else text) / (100 if percent else 1)
    except ValueError:
        return None
    return rate if 0 <= rate <= 1 else None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``threshold`` subcommand to ``pml-eval``'s subparsers."""
    parser = add_command(
        subparsers,
        "threshold",
        "Choose the match threshold that maximizes a metric on labelled pairs. "
        "SCORES holds one distance per pair (smaller = more alike), or one similarity with "
        "--similarity; --labels says which pairs should match.",
    )
    parser.add_argument(
        "scores", metavar="SCORES", help="one score per pair (.npy, .npz, .pt, .csv)"
    )
    parser.add_argument(
        "--labels", required=True, metavar="FILE", help="per pair: 1/true if it should match"
    )
    parser.add_argument(
        "--metric",
        type=metric_name,
        default="f1",
        metavar="METRIC",
        help="f1 (default), accuracy, balanced_accuracy, or tar@far=RATE (the highest true "
        "match rate at a false match rate of at most RATE)",
    )
    parser.add_argument(
        "--similarity", action="store_true", help="scores are similarities (larger = more alike)"
    )
    parser.add_argument("--output", metavar="FILE.json", help="write results as JSON ('-': stdout)")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw the metric against the threshold, ROC and DET"
    )
    parser.set_defaults(run=Deferred("threshold", (_outputs,)))


def _outputs(args: argparse.Namespace) -> None:
    check_outputs(
        {"--output": args.output, "--plot": args.plot},
        {"SCORES": args.scores, "--labels": args.labels},
    )
