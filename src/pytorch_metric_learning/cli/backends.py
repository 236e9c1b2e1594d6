"""``pml-eval backends``: every installed k-NN and k-means backend, and whether it imports."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Callable

from ..evaluation.registry import BackendInfo, backend_info, kmeans_factory, knn_factory
from ._commands import COMMANDS
from ._output import format_table, write_results
from ._versions import distribution_version

__all__ = ["BackendStatus", "backend_statuses", "add_parser", "run"]

_FACTORIES: dict[str, Callable[[str], object]] = {"knn": knn_factory, "kmeans": kmeans_factory}
_TITLES = {"knn": "k-NN backends", "kmeans": "k-means backends"}


@dataclass(frozen=True)
class BackendStatus:
    """One row of the listing.

    Attributes:
        kind: ``"knn"`` or ``"kmeans"``.
        name: The name a spec selects it by.
        distribution: The distribution that declares it (several, comma-separated, when
            they conflict).
        version: That distribution's version, or ``""`` when unknown.
        status: ``"ok"`` when its factory imports, else ``"broken"``.
        error: Why it is broken (``""`` when it is not).
    """

    kind: str
    name: str
    distribution: str
    version: str
    status: str
    error: str


def backend_statuses(kind: str) -> list[BackendStatus]:
    """Import each ``kind`` backend's factory and report what happened, without raising.

    Example:
        >>> [row.status for row in backend_statuses("knn") if row.name == "custom"]
        ['ok']
    """
    return [_status(kind, info) for info in backend_info(kind)]


def _status(kind: str, info: BackendInfo) -> BackendStatus:
    versions = [distribution_version(name) for name in info.distributions]
    try:
        _FACTORIES[kind](info.name)
    except Exception as error:  # a broken plugin must not break the listing
        status, reason = "broken", _reason(error)
    else:
        status, reason = "ok", ""
    return BackendStatus(
        kind=kind,
        name=info.name,
        distribution=", ".join(info.distributions),
        version=", ".join(version for version in versions if version),
        status=status,
        error=reason,
    )


def _reason(error: BaseException) -> str:
    """The original cause when the registry wrapped it (the plugin's own error)."""
    cause = error.__cause__ or error
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``backends`` subcommand to ``pml-eval``'s subparsers."""
    parser = subparsers.add_parser(
        "backends",
        help=COMMANDS["backends"][1],
        description="List every installed k-NN and k-means backend: its name, the "
        "distribution that provides it with its version, and whether it imports.",
    )
    parser.add_argument(
        "--output", metavar="FILE.json", help="also write the listing as JSON ('-' for stdout)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """List the backends; exit code 0 even when some are broken (the listing says which)."""
    rows = {kind: backend_statuses(kind) for kind in _FACTORIES}
    if args.output != "-":
        print(_render(rows))
    if args.output:
        write_results(
            args.output, {kind: [asdict(row) for row in found] for kind, found in rows.items()}
        )
    broken = sum(row.status == "broken" for found in rows.values() for row in found)
    if broken:
        print(f"{broken} backend(s) failed to import; see the error column.", file=sys.stderr)
    return 0


def _render(rows: dict[str, list[BackendStatus]]) -> str:
    blocks = []
    for kind, found in rows.items():
        if not found:
            blocks.append(f"{_TITLES[kind]}: none installed")
            continue
        table = format_table(
            ["name", "distribution", "version", "status"],
            [[row.name, row.distribution, row.version, _status_cell(row)] for row in found],
        )
        blocks.append(f"{_TITLES[kind]}\n{table}")
    return "\n\n".join(blocks)


def _status_cell(row: BackendStatus) -> str:
    return row.status if not row.error else f"{row.status} ({row.error})"
