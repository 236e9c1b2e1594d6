"""The options of ``pml-eval backends`` (the work: :mod:`pytorch_metric_learning.cli.backends`)."""

from __future__ import annotations

import argparse

from .._paths import check_outputs
from ._common import Deferred, add_command

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
        help="run each backend once on tiny data and check its output (default: on; "
        "--no-check only imports and builds them)",
    )
    parser.add_argument(
        "--output", metavar="FILE.json", help="also write the listing as JSON ('-' for stdout)"
    )
    parser.set_defaults(run=Deferred("backends", (_outputs,)))


def _outputs(args: argparse.Namespace) -> None:
    check_outputs({"--output": args.output}, {})
