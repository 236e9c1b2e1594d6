"""The options of ``pml-eval backends`` (the work: :mod:`pytorch_metric_learning.cli.backends`)."""

from __future__ import annotations

import argparse

from .._paths import check_outputs
from ._common import Deferred, add_command, int_at_least

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``backends`` subcommand to ``pml-eval``'s subparsers."""
    parser = add_command(
        subparsers,
        "backends",
        "List every installed k-NN and k-means backend: its name, the "
        "distribution that provides it with its version, and whether it works: built with "
        "its defaults and run once on tiny data through the contract checks.",
    )
    parser.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each backend through realistic searches and check its output's form and "
        "content (default: on; --no-check only imports and builds them)",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(64, "an int of at least 64"),
        default=None,
        metavar="N",
        help="reference rows of each k-NN check search (default: 2000; at least 64)",
    )
    parser.add_argument(
        "--import-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="give up on a backend whose import and build take longer than this (default: 30)",
    )
    parser.add_argument(
        "--output", metavar="FILE.json", help="also write the listing as JSON ('-' for stdout)"
    )
    parser.set_defaults(run=Deferred("backends", (_outputs,)))


def _outputs(args: argparse.Namespace) -> None:
    check_outputs({"--output": args.output}, {})


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number. Got {text!r} instead")
    return value
