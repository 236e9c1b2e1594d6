"""``pml-eval backends``: every installed k-NN and k-means backend, and whether it works.

Each backend is built with its defaults (which imports it and checks it against its
Protocol) and, unless ``--no-check``, run once on tiny data through the contract checks.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..errors import PMLError
from ..evaluation.search.registry import BackendInfo, backend_info, load_kmeans_func, load_knn_func
from ._backend_check import kmeans_problem, knn_problem
from ._output import format_table, write_results
from ._paths import check_outputs
from ._versions import distribution_version

__all__ = ["BackendStatus", "backend_statuses", "run"]

_LOADERS: dict[str, Callable[[str], Any]] = {"knn": load_knn_func, "kmeans": load_kmeans_func}
_CHECKS: dict[str, Callable[[Any], str]] = {"knn": knn_problem, "kmeans": kmeans_problem}
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
        status: ``"ok"`` when it imports, builds with its defaults and (when checked)
            passes a tiny search through the contract checks; else ``"not ok"``.
        error: Why it is not ok (``""`` when it is).
        advice: The library's whole message when it diagnosed the failure (a misspelled
            entry point, a factory of the wrong shape, ...), else ``""``.
    """

    kind: str
    name: str
    distribution: str
    version: str
    status: str
    error: str
    advice: str = ""


def backend_statuses(kind: str, check: bool = True) -> list[BackendStatus]:
    """Build (and, if ``check``, try) each ``kind`` backend and report it, without raising.

    Example:
        >>> [row.status for row in backend_statuses("knn") if row.name == "custom"]
        ['ok']
    """
    return [_status(kind, info, check) for info in backend_info(kind)]


def _status(kind: str, info: BackendInfo, check: bool) -> BackendStatus:
    versions = [distribution_version(name) for name in info.distributions]
    advice = ""
    try:
        backend = _LOADERS[kind](info.name)
    except Exception as error:  # a broken plugin must not break the listing
        reason = _reason(error)
        advice = " ".join(str(error).split()) if isinstance(error, PMLError) else ""
    else:
        reason = _CHECKS[kind](backend) if check else ""
    return BackendStatus(
        kind=kind,
        name=info.name,
        distribution=", ".join(info.distributions),
        version=", ".join(version for version in versions if version),
        status="not ok" if reason else "ok",
        error=reason,
        advice=advice if advice != reason else "",
    )


def _reason(error: BaseException) -> str:
    """The original cause when the registry wrapped it (the plugin's own error)."""
    cause = error.__cause__ or error
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def run(args: argparse.Namespace) -> int:
    """List the backends; exit code 0 even when some are not ok (the listing says which)."""
    check_outputs({"--output": args.output}, {})
    rows = {kind: backend_statuses(kind, args.check) for kind in _LOADERS}
    if args.output != "-":
        print(_render(rows))
    if args.output:
        write_results(
            args.output, {kind: [asdict(row) for row in found] for kind, found in rows.items()}
        )
    failing = sum(row.status != "ok" for found in rows.values() for row in found)
    for row in (row for found in rows.values() for row in found if row.advice):
        print(f"{row.name}: {row.advice}", file=sys.stderr)
    if failing:
        print(f"{failing} backend(s) not ok; the status column says why.", file=sys.stderr)
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
