"""The ``pml-eval`` command (also ``python -m pytorch_metric_learning``).

Subcommands: ``evaluate`` (retrieval and clustering metrics of embedding files),
``threshold`` (a verification threshold from scored pairs), ``backends`` (what is
installed), ``demo`` (train, validate, test and plot on the UCI digits). The parser and
exit codes live in :mod:`pytorch_metric_learning.cli.app`; importing this package loads
none of the subcommands.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pml-eval`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        pml-eval ...
        0
    """
    from .app import main as run_app

    return run_app(argv)
