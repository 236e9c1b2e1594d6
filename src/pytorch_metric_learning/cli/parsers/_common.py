"""Option types and the deferred runner shared by the subcommands' parsers (no torch)."""

from __future__ import annotations

import argparse
import importlib
import re
from typing import Callable

from ..._metric_catalog import describe_families, parametrized_parts
from .._commands import COMMANDS
from .._errors import UsageError

__all__ = [
    "Deferred",
    "add_command",
    "int_at_least",
    "positive_int",
    "non_negative_int",
    "ci_level",
    "TORCH_DEVICE_TYPES",
    "MAX_DEVICE_INDEX",
    "device_name",
    "device_spelling_problem",
    "metric_names",
    "check_metric_names",
    "add_bootstrap_arguments",
    "check_ci_options",
]

Check = Callable[[argparse.Namespace], None]


class Deferred:
    """``args.run`` of a subcommand: run the torch-free checks, then import the work module.

    A plain class, not a dataclass: ``dataclasses`` imports ``inspect``, which would slow
    every ``--help``.

    Attributes:
        module: The work module under ``pytorch_metric_learning.cli`` (``"evaluate"``).
        checks: Checks of the parsed options that need no file and no torch; each raises
            :class:`UsageError` (exit 2).
    """

    __slots__ = ("module", "checks")

    def __init__(self, module: str, checks: tuple[Check, ...] = ()) -> None:
        self.module = module
        self.checks = checks

    def __repr__(self) -> str:
        return f"Deferred(module={self.module!r}, checks={self.checks!r})"

    def __call__(self, args: argparse.Namespace) -> int:
        for check in self.checks:
            check(args)
        work = importlib.import_module(f"{__package__.rpartition('.')[0]}.{self.module}")
        return int(work.run(args))


def add_command(
    subparsers: argparse._SubParsersAction, name: str, description: str
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, with its one-line help from the command table."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=COMMANDS[name][1], description=description
    )
    return parser


def int_at_least(minimum: int, expected: str) -> Callable[[str], int]:
    """An argparse ``type``: an int of at least ``minimum``, else an error saying ``expected``.

    Example:
        >>> int_at_least(1, "a positive int")("3")
        3
    """

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {expected}. Got {text!r} instead")
        return value

    return convert


positive_int = int_at_least(1, "a positive int")
# NumPy's generators take no negative seed.
non_negative_int = int_at_least(0, "a non-negative int")


# More resamples than this add no precision a percentile can show and would take
# num_resamples x queries memory; the API has no bound, the command line names one.
MAX_RESAMPLES = 1_000_000


def resamples_count(text: str) -> int:
    """An argparse ``type`` for ``--resamples``: an int from 1 to ``MAX_RESAMPLES``.

    Example:
        >>> resamples_count("2000")
        2000
    """
    value = positive_int(text)
    if value > MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(
            f"must be a positive int of at most {MAX_RESAMPLES}. Got {_cut(text)} instead"
        )
    return value


def _cut(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def ci_level(text: str) -> float:
    """A confidence level given in percent, e.g. ``95``, as a fraction.

    Example:
        >>> ci_level("95")
        0.95
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 < value < 100:  # 0.95 is a fraction typed by mistake, not a 0.95% interval
        raise argparse.ArgumentTypeError(
            f"must be a percentage between 1 and 100, e.g. 95. Got {text!r} instead"
        )
    return value / 100


# The device types that torch.device(...) accepts by name (c10/core/DeviceType.cpp,
# parse_type; "privateuseone" unless a plugin renamed it), written out so that a malformed
# --device is refused without importing torch. tests/cli/test_device_names.py compares
# this grammar with torch.device on generated strings.
TORCH_DEVICE_TYPES = (
    "cpu",
    "cuda",
    "ipu",
    "xpu",
    "mkldnn",
    "opengl",
    "opencl",
    "ideep",
    "hip",
    "ve",
    "fpga",
    "maia",
    "xla",
    "lazy",
    "vulkan",
    "mps",
    "meta",
    "hpu",
    "mtia",
    "privateuseone",
)
# torch keeps a device index in an int8 (it wraps larger ones): 0 to 127, no leading zeros.
MAX_DEVICE_INDEX = 127
_DEVICE = re.compile(r"(?P<type>[A-Za-z0-9_]+)(?::(?P<index>0|[1-9][0-9]{0,2}))?")


def device_name(text: str) -> str:
    """The spelling of a torch device (``cpu``, ``cuda:1``), checked without torch.

    Whether this machine can compute on it (``cuda`` on a machine without CUDA) is checked
    when the command runs, with torch. ``meta`` is refused here: it holds no values.

    Example:
        >>> device_name("cuda:0")
        'cuda:0'
    """
    problem = device_spelling_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    if text.partition(":")[0] == "meta":
        raise argparse.ArgumentTypeError(
            f"cannot compute on {text!r}: meta tensors have shapes but no values; use cpu or cuda"
        )
    return text


def device_spelling_problem(text: str) -> str:
    """Why ``text`` is not a device string ``torch.device`` accepts, or ``""``.

    Example:
        >>> device_spelling_problem("cuda:1"), device_spelling_problem("cuda:01") != ""
        ('', True)
    """
    found = _DEVICE.fullmatch(text)
    valid = (
        found is not None
        and found["type"] in TORCH_DEVICE_TYPES
        and int(found["index"] or 0) <= MAX_DEVICE_INDEX
    )
    if valid:
        return ""
    if found is not None and found["type"] not in TORCH_DEVICE_TYPES:
        return (
            f"must be a torch device; {found['type']!r} is not a device type (torch knows "
            f"{', '.join(TORCH_DEVICE_TYPES)}). Got {text!r} instead"
        )
    return (
        "must be a torch device TYPE or TYPE:INDEX (e.g. cpu, cuda, cuda:1, mps), with INDEX 0 "
        f"to {MAX_DEVICE_INDEX} and no leading zeros. Got {text!r} instead"
    )


def check_metric_names(names: tuple[str, ...], known: tuple[str, ...]) -> tuple[str, ...]:
    """Known names and ``recall_at_<K>``-style names pass; others are an argparse error.

    Example:
        >>> check_metric_names(("precision_at_1", "recall_at_4"), ("precision_at_1",))
        ('precision_at_1', 'recall_at_4')
    """
    unknown = [name for name in names if name not in known and parametrized_parts(name) is None]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown metric {unknown[0] if unknown else ''!r}; choose among "
            f"{', '.join(known)}, or {describe_families()}"
        )
    return names


def metric_names(known: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type`` for ``--metrics NAME,...`` among ``known`` and the families."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        return check_metric_names(names, known)

    return parse


def add_bootstrap_arguments(parser: argparse.ArgumentParser, ci_default: float | None) -> None:
    """``--ci``, ``--ci-by-class``, ``--resamples`` and ``--seed``."""
    default = "" if ci_default is None else f" (default: {ci_default * 100:g})"
    parser.add_argument(
        "--ci",
        type=ci_level,
        default=ci_default,
        metavar="PERCENT",
        help=f"confidence interval over queries at this level, e.g. 95{default}",
    )
    parser.add_argument(
        "--ci-by-class",
        action="store_true",
        help="resample whole classes instead of queries (queries of a class are correlated)",
    )
    parser.add_argument(
        "--resamples",
        type=resamples_count,
        default=1000,
        help=f"bootstrap resamples, at most {MAX_RESAMPLES:,} (default: 1000)",
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="bootstrap seed (default: 0)"
    )


def check_ci_options(args: argparse.Namespace) -> None:
    """Intervals are of plain averages over queries: not per class, not of class averages."""
    if args.ci is None and args.ci_by_class:
        raise UsageError("--ci-by-class chooses how --ci resamples; it needs --ci")
    if args.ci is not None and (args.per_class or args.avg_of_avgs):
        raise UsageError(
            "--ci gives intervals of averages over queries; it cannot be combined with "
            "--per-class or --avg-of-avgs"
        )
