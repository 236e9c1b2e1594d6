"""The ``pml-eval`` application: argument parsing, dispatch, and one-line errors.

Exit codes: 0 success, 1 unusable input (a missing, empty or unreadable file, a wrong
shape, labels of another length) or an output file that cannot be written, 2 a malformed
command line (argparse's errors, contradictory options, a device this machine cannot use,
an output path that names an input), 3 a backend that is unknown, not installed, broken or
claimed by several distributions, 4 an unexpected internal error, 130 interrupted.

Only the parser of the subcommand being run is imported (from
:mod:`pytorch_metric_learning.cli.parsers`, which imports no torch), and its work module
only when it runs: ``--help`` and ``--version``, a subcommand's ``--help`` and every
argument error answer without importing torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn, TextIO

from .. import __version__
from ..errors import BackendError, PMLError
from ._commands import COMMANDS
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

# When pml-eval started (this module is among the first it imports): ``demo`` reports its
# time from here, start-up included. A call of main(argv) from Python counts from the call.
_STARTED = time.perf_counter()


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors become one line instead of usage plus exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser(command: str | None = "") -> argparse.ArgumentParser:
    """The ``pml-eval`` parser.

    Args:
        command: The subcommand whose options are needed: its module alone is imported,
            the others appear by name and help only. ``""`` (the default) loads them all;
            ``None`` loads none (enough for ``pml-eval --help``).

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
    _add_verbose(parser, default=0)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name, (module, help_text) in COMMANDS.items():
        if command == "" or name == command:
            _command_module(module).add_parser(subparsers)
            _add_verbose(subparsers.choices[name], default=argparse.SUPPRESS)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, default: Any) -> None:
    """``-v`` works before and after the subcommand; ``-vv`` adds debug messages."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="show the library's progress messages (-vv: also debug messages)",
    )


def _command_module(module: str) -> Any:
    """The torch-free module that defines a subcommand's options (its work is imported
    only when it runs)."""
    return importlib.import_module(f"{__package__}.parsers.{module}")


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (top-level options take no values)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pml-eval`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Example:
        >>> main(["backends", "--output", "-"]) == EXIT_OK  # doctest: +ELLIPSIS
        {...
        True
    """
    started = time.perf_counter()
    args_list = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _WarningPrinter()
        try:
            args = build_parser(_chosen_command(args_list)).parse_args(args_list)
        except UsageError as error:
            return _fail(f"{error}", EXIT_USAGE)
        except SystemExit as done:  # --help and --version
            return int(done.code or 0)
        args.argv = args_list
        args.started = _STARTED if argv is None else started
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


class _WarningPrinter:
    """``warnings.showwarning`` for one command: each distinct warning printed once, as
    ``pml-eval: warning: ...`` (a command that computes twice, e.g. the metrics and then
    the worst queries, says a thing once)."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split())
        if text in self.shown:
            return
        self.shown.add(text)
        print(f"{PROG}: warning: {text}", file=file or sys.stderr)


class _OncePerCommand(logging.Filter):
    """Lets each distinct warning or error of the library's log through once per command;
    info and debug messages (``-v``) all pass."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


@contextlib.contextmanager
def _logging_to_stderr(verbose: int) -> Iterator[None]:
    """Show the library's warnings; ``-v`` adds its info messages and ``-vv`` its debug ones."""
    logger = logging.getLogger("pytorch_metric_learning")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    handler.addFilter(_OncePerCommand())
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(_LEVELS[min(verbose, len(_LEVELS) - 1)])
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
