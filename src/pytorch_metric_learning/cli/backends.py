"""``pml-eval backends``: every installed k-NN and k-means backend, and whether it works.

Each backend is built with its defaults (which imports it and checks it against its
Protocol) and, unless ``--no-check``, run through the contract's form and content checks
(:func:`~pytorch_metric_learning.evaluation.check_knn_backend`, ``--size`` rows).

A plugin cannot take the listing down: an exception, ``SystemExit`` or
``KeyboardInterrupt`` at import makes its row ``not ok``; an import still running after
``--import-timeout`` seconds (default :data:`IMPORT_TIME_LIMIT`) is given up on (``not ok:
import took longer than N s``). Python cannot stop a thread, so that import stays blocked
in a daemon thread until the command exits (it does not wait for it). On a terminal each
name is printed to stderr as it is loaded; elsewhere (a log, a pipe) only the names of
backends still loading after :data:`SLOW_LOAD` s. What plugins print goes to stderr while
``--output -`` writes the JSON to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..errors import PMLError
from ..evaluation.search.knn_output import CHECK_SIZE
from ..evaluation.search.registry import BackendInfo, backend_info, load_kmeans_func, load_knn_func
from ._backend_check import kmeans_problem, knn_trial
from ._output import format_table, write_results
from ._paths import check_outputs
from ._versions import distribution_version

__all__ = ["BackendStatus", "IMPORT_TIME_LIMIT", "backend_statuses", "run"]

IMPORT_TIME_LIMIT = 30.0  # seconds a backend may take to import and build (--import-timeout)
SLOW_LOAD = 1.0  # seconds after which a loading backend is named on stderr (off a terminal)

_LOADERS: dict[str, Callable[[str], Any]] = {"knn": load_knn_func, "kmeans": load_kmeans_func}
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
        note: For an approximate backend (``is_exact = False``): the recall its check
            measured; else ``""`` (and left out of the JSON).
    """

    kind: str
    name: str
    distribution: str
    version: str
    status: str
    error: str
    advice: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, str]:
        """The row for JSON: every field, ``note`` only when there is one."""
        row = asdict(self)
        if not self.note:
            del row["note"]
        return row


def backend_statuses(
    kind: str,
    check: bool = True,
    size: int = CHECK_SIZE,
    import_timeout: float = IMPORT_TIME_LIMIT,
    progress: Callable[[str], None] | None = None,
) -> list[BackendStatus]:
    """Build (and, if ``check``, try) each ``kind`` backend and report it, without raising.

    Args:
        kind: ``"knn"`` or ``"kmeans"``.
        check: Run each backend through the contract checks.
        size: Reference rows of the k-NN check.
        import_timeout: Seconds after which a backend still importing is given up on.
        progress: Told each backend's name as it is loaded (on a terminal), else the
            names of those still loading after ``SLOW_LOAD`` seconds.

    Example:
        >>> [row.status for row in backend_statuses("knn", size=200) if row.name == "custom"]
        ['ok']
    """
    rows = []
    for info in backend_info(kind):
        rows.append(_status(kind, info, check, size, import_timeout, progress))
    return rows


def _load_in_time(
    kind: str, name: str, limit: float, progress: Callable[[str], None] | None = None
) -> Any:
    """Load a backend in a daemon thread; raise ``TimeoutError`` when it takes over ``limit`` s.

    ``progress`` hears the name when loading starts on a terminal, else once the load has
    taken :data:`SLOW_LOAD` seconds (so a stalled import is named while it stalls, and
    quick ones add no lines to a log). A stuck import cannot be stopped: its thread stays
    blocked (a daemon, so the process still exits) and the listing goes on.
    """
    outcome: dict[str, Any] = {}

    def load() -> None:
        try:
            outcome["backend"] = _LOADERS[kind](name)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=load, name=f"pml-load-{kind}-{name}", daemon=True)
    worker.start()
    say = f"{_TITLES[kind]}: loading {name!r}"
    if progress is not None and sys.stderr.isatty():
        progress(say)
    worker.join(min(limit, SLOW_LOAD))
    if worker.is_alive() and progress is not None and not sys.stderr.isatty():
        progress(f"{say} (still importing after {SLOW_LOAD:g} s)")
    worker.join(max(0.0, limit - SLOW_LOAD))
    if worker.is_alive():
        raise TimeoutError(f"import took longer than {limit:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["backend"]


def _status(
    kind: str,
    info: BackendInfo,
    check: bool,
    size: int,
    import_timeout: float,
    progress: Callable[[str], None] | None = None,
) -> BackendStatus:
    versions = [distribution_version(name) for name in info.distributions]
    advice = note = ""
    try:
        backend = _load_in_time(kind, info.name, import_timeout, progress)
    except TimeoutError as error:
        reason = str(error)
    except Exception as error:  # a broken plugin must not break the listing
        reason = _reason(error)
        advice = " ".join(str(error).split()) if isinstance(error, PMLError) else ""
    else:
        if not check:
            reason = ""
        elif kind == "knn":
            reason, note = knn_trial(backend, size, info.name)
        else:
            reason = kmeans_problem(backend)
    return BackendStatus(
        kind=kind,
        name=info.name,
        distribution=", ".join(info.distributions),
        version=", ".join(version for version in versions if version),
        status="not ok" if reason else "ok",
        error=reason,
        advice=advice if advice != reason else "",
        note=note,
    )


def _reason(error: BaseException) -> str:
    """The original cause when the registry wrapped it (the plugin's own error); the
    library's own message when the cause ended the program (``SystemExit``)."""
    cause = error.__cause__ or error
    if not isinstance(cause, Exception):
        cause = error
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def run(args: argparse.Namespace) -> int:
    """List the backends; exit code 0 even when some are not ok (the listing says which)."""
    check_outputs({"--output": args.output}, {})
    size = CHECK_SIZE if args.size is None else args.size
    timeout = IMPORT_TIME_LIMIT if args.import_timeout is None else args.import_timeout
    quiet = contextlib.redirect_stdout(sys.stderr) if args.output == "-" else _nothing()
    with quiet:  # what plugins print must not corrupt the JSON on stdout
        rows = {
            kind: backend_statuses(kind, args.check, size, timeout, _progress) for kind in _LOADERS
        }
    if args.output != "-":
        print(_render(rows))
    if args.output:
        write_results(
            args.output, {kind: [row.as_dict() for row in found] for kind, found in rows.items()}
        )
    failing = sum(row.status != "ok" for found in rows.values() for row in found)
    for row in (row for found in rows.values() for row in found if row.advice):
        print(f"{row.name}: {row.advice}", file=sys.stderr)
    if failing:
        print(f"{failing} backend(s) not ok; the status column says why.", file=sys.stderr)
    return 0


def _progress(line: str) -> None:
    print(f"pml-eval: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _nothing() -> Any:
    yield


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
    if row.error:
        return f"{row.status} ({row.error})"
    return row.status if not row.note else f"{row.status} ({row.note})"
