"""Plain-text tables and JSON files for the command's results."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_text

__all__ = ["format_table", "format_number", "write_json", "write_results", "say_written"]


def format_number(value: Any) -> str:
    """Four decimals for floats, ``nan`` kept visible; other values as ``str``.

    Example:
        >>> format_number(0.123456), format_number(float("nan")), format_number(3)
        ('0.1235', 'nan', '3')
    """
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header.

    Example:
        >>> print(format_table(["name", "value"], [["precision_at_1", 0.5]]))
        name            value
        --------------  ------
        precision_at_1  0.5000
    """
    cells = [[str(item) for item in header]]
    cells += [[format_number(item) for item in row] for row in rows]
    widths = [max(len(row[col]) for row in cells) for col in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def write_json(destination: str | Path, data: Any) -> Path | None:
    """Write ``data`` as indented JSON to a file (parents created) or to stdout for ``-``.

    Strict JSON has no NaN or infinity: NaN is written as ``null`` and infinities as the
    strings ``"inf"`` and ``"-inf"`` (which Python's ``float`` reads back). A file is
    written atomically, keeping its mode; a FIFO or a device (``/dev/null``, a
    ``/dev/stdout`` link) is written in place as the shell's ``>`` does, never replaced
    (see ``_atomic``). The path is returned (``None`` for stdout).
    """
    text = json.dumps(_finite(data), indent=2, sort_keys=False) + "\n"
    if str(destination) == "-":
        sys.stdout.write(text)
        return None
    return atomic_write_text(destination, text, in_place=True)


def write_results(destination: str | Path, data: Any) -> None:
    """:func:`write_json`, then say where the file went (``--output`` of every command)."""
    path = write_json(destination, data)
    if path is not None:
        say_written("Results", path, to_stderr=False)


def say_written(what: str, path: Path, to_stderr: bool) -> None:
    """Tell the user where a file went: ``Results written to out.json``.

    Example:
        >>> say_written("Plot", Path("plot.png"), to_stderr=False)
        Plot written to plot.png
    """
    print(f"{what} written to {path}", file=sys.stderr if to_stderr else sys.stdout)


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None if math.isnan(data) else ("inf" if data > 0 else "-inf")
    if isinstance(data, dict):
        return {str(key): _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data
