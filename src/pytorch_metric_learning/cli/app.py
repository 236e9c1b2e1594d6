"""The ``pml-eval`` application: argument parsing, dispatch, and one-line errors.

Exit codes: 0 success, 1 unusable input (a missing file, a wrong shape, labels of another
length), 2 a command line argparse rejects, 3 a backend that is unknown, not installed or
broken, 4 an unexpected internal error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn, TextIO

from .. import __version__
from ..errors import BackendError, PMLError
from . import backends, compare, demo, evaluate, threshold
from ._errors import UsageError

__all__ = [
    "EXIT_OK",
    "EXIT_INPUT",
    "EXIT_USAGE",
    "EXIT_BACKEND",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "build_parser",
    "main",
]

PROG = "pml-eval"
EXIT_OK = 0
EXIT_INPUT = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors become one line instead of usage plus exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The full ``pml-eval`` parser with every subcommand.

    Example:
        >>> build_parser().parse_args(["backends"]).command
        'backends'
    """
    parser = _Parser(
        prog=PROG,
        description="Score embeddings, choose verification thresholds, list k-NN backends, "
        "and run an end-to-end demo.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="show the full traceback of an unexpected error (for bug reports)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for module in _command_modules():
        module.add_parser(subparsers)
    return parser


def _command_modules() -> list[Any]:
    return [evaluate, compare, threshold, backends, demo]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pml-eval`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Example:
        >>> main(["backends", "--output", "-"]) == EXIT_OK  # doctest: +ELLIPSIS
        {...
        True
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            args = build_parser().parse_args(args_list)
        except UsageError as error:
            return _fail(f"{error}", EXIT_USAGE)
        except SystemExit as done:  # --help and --version
            return int(done.code or 0)
        args.argv = args_list
        with _logging_to_stderr(args.verbose):
            return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except UsageError as error:
        return _fail(str(error), EXIT_USAGE)
    except BackendError as error:
        return _fail(str(error), EXIT_BACKEND)
    except (PMLError, OSError, ValueError, TypeError) as error:
        return _fail(_describe(error), EXIT_INPUT)
    except Exception as error:
        if args.traceback:
            raise
        return _fail(
            f"internal error: {type(error).__name__}: {error} "
            f"(rerun with '{PROG} --traceback ...' and report it)",
            EXIT_INTERNAL,
        )


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None and not str(error).strip():
        return f"cannot use '{error.filename}'"
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        return f"{error.strerror}: '{error.filename}'"
    return str(error) or type(error).__name__


def _fail(message: str, code: int, stream: TextIO | None = None) -> int:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=stream or sys.stderr)
    return code


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    text = " ".join(str(message).split())
    print(f"{PROG}: warning: {text}", file=file or sys.stderr)


@contextlib.contextmanager
def _logging_to_stderr(verbose: bool) -> Iterator[None]:
    """Show the library's warnings (and, with ``--verbose``, its info) while a command runs."""
    logger = logging.getLogger("pytorch_metric_learning")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
