"""Read a CSV file of numbers or names into an array, every value exactly.

Integer cells are parsed as Python integers (never through ``float``), so labels above
2^53 stay distinct; they become int64, or uint64 when they all fit it but not int64, and
a cell outside both is refused. For labels, a float cell counts only when its decimal
text is a whole number no larger than 2^53 in magnitude (the rule ``.npy`` and ``.pt``
float labels follow), so one ``1.0`` never turns the other cells into floats. For
embeddings and scores, any other number cell makes the whole file float64 (``inf`` and
``nan`` included, which the loaders then refuse as they refuse them in ``.npy``). Only
ASCII digits are digits: ``1_000`` and non-ASCII digits are names, not numbers. A first line of names over lines of numbers, or a first line whose one cell is
a usual column name (``label``, ``class``, ...), is a header; ``FILE.csv:COLUMN`` picks a
column by its header name.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["CsvError", "EXACT_FLOAT", "FileRole", "as_role", "float_label_message", "parse_csv"]

# A one-column file of names whose first line is one of these is read as having a header.
HEADER_NAMES = frozenset(
    {"label", "labels", "class", "classes", "target", "targets", "y", "name", "names"}
    | {"category", "id", "ids", "embeddings", "scores", "score", "pair", "pairs"}
)
_INTEGER = re.compile(r"[+-]?[0-9]+")
# ASCII digits only: Python's float() and int() also take "1_000" and non-ASCII digits.
_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
# A float label is exact only up to 2^53 (float64's 53-bit significand).
EXACT_FLOAT = 2**53
_INT64 = np.iinfo(np.int64)
_UINT64 = np.iinfo(np.uint64)


class CsvError(InvalidArgumentError):
    """A CSV file that does not hold a table of values the loaders can use."""


@dataclass(frozen=True)
class FileRole:
    """What a file's values are for: how they are read and what the messages call them.

    Attributes:
        kind: How the values are read: ``"embeddings"``, ``"labels"`` (integers or names:
            labels, group ids, categories) or ``"scores"``.
        plural: What the messages call the values (``"group ids"``).
        singular: One of them (``"group id"``), given, never derived from ``plural``.
        option: The command-line option that names the file, named in every message.
        key: The array a several-array file (``.npz``, a ``.pt`` dict) is read from by
            default (its role's own name: ``"labels"``, ``"groups"``, ``"categories"``).
        header_names: A one-column CSV file whose first line is one of these names (any
            case) has a header line.
    """

    kind: str
    plural: str
    singular: str
    option: str | None = None
    key: str = ""
    header_names: frozenset[str] = HEADER_NAMES

    @property
    def what(self) -> str:
        """The values and their option, e.g. ``"group ids (--query-groups)"``."""
        return f"{self.plural} ({self.option})" if self.option else self.plural

    @property
    def default_key(self) -> str:
        return self.key or self.kind


# The roles named by a plain string, with their singular nouns given.
_SINGULAR = {"embeddings": "embedding", "labels": "label", "scores": "score"}


def as_role(role: str | FileRole) -> FileRole:
    """``role`` as a :class:`FileRole` (``"labels"``, ``"embeddings"``, ``"scores"``)."""
    if isinstance(role, FileRole):
        return role
    return FileRole(role, role, _SINGULAR.get(role, role))


def parse_csv(
    data: bytes, name: str, role: str | FileRole, column: str | None = None
) -> np.ndarray:
    """The values of a CSV file's bytes as a ``(rows, columns)`` array.

    Args:
        data: The file's bytes (UTF-8, with or without a byte order mark).
        name: The file, for messages.
        role: What the values are for (``embeddings``, ``labels``, ``scores``, or a
            :class:`FileRole`).
        column: A header name: only that column is read, and the file needs a header.

    Raises:
        CsvError: no rows, a header line and no rows, ragged rows, an unknown column, or
            an integer outside uint64 and int64.

    Example:
        >>> parse_csv(b"label\\n9007199254740993\\n9007199254740992\\n", "l.csv", "labels")
        array([[9007199254740993],
               [9007199254740992]])
    """
    role = as_role(role)
    rows = _rows(data.decode("utf-8-sig"))
    if not rows:
        raise CsvError(f"The {role.what} file '{name}' is empty: it has no rows of values.")
    header = _header(rows, role)
    if column is not None:
        header = _named_header(rows, header, column, name)
    body = rows[1:] if header is not None else rows
    if not body:
        raise CsvError(
            f"The {role.what} file '{name}' has a header line ({', '.join(rows[0])}) but no rows."
        )
    widths = sorted({len(row) for row in body} | ({len(header)} if header else set()))
    if len(widths) > 1:
        raise CsvError(f"The rows of '{name}' have different numbers of columns: {widths}.")
    if column is not None:
        body = [[row[_column_index(header, column, name)]] for row in body]
    return _values(body, name, role)


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in io.StringIO(text, newline="") if not line.lstrip().startswith("#")]
    rows = [row for row in csv.reader(lines) if row and any(cell.strip() for cell in row)]
    return [[cell.strip() for cell in row] for row in rows]


def _header(rows: list[list[str]], role: FileRole) -> list[str] | None:
    """The first row, if it is a header line (the rule ``docs/cli.md`` states).

    Names can be labels, so a line of names is a header over lines that are all numbers,
    or when it is one usual column name; for numbers only (embeddings, scores) it always is.
    """
    first = rows[0]
    if any(_number(cell) for cell in first):
        return None
    if role.kind != "labels":
        return first
    usual = first[0].lower() in role.header_names
    if len(rows) == 1:  # one line of names alone: a header over no rows, or one name
        return first if len(first) > 1 or usual else None
    if all(_number(cell) for row in rows[1:] for cell in row):
        return first
    return first if len(first) == 1 and usual else None


def _named_header(
    rows: list[list[str]], header: list[str] | None, column: str, name: str
) -> list[str]:
    """The header ``FILE.csv:COLUMN`` needs: a line of names (the first, if no values)."""
    if header is not None:
        return header
    if not any(_number(cell) for cell in rows[0]):
        return rows[0]  # names over names: the first line names the columns
    raise CsvError(
        f"'{name}' has no header line (its first line holds values: "
        f"{_shown(', '.join(rows[0]))}), so it has no column '{column}'; add a header line "
        f"or drop ':{column}'."
    )


def _column_index(header: list[str] | None, column: str, name: str) -> int:
    if header is None or column not in header:
        raise CsvError(f"'{name}' has no column '{column}'. Its header line names: {header or []}.")
    if header.count(column) > 1:
        raise CsvError(
            f"'{name}' has {header.count(column)} columns named '{column}', so '{name}:"
            f"{column}' is ambiguous; give the columns different names."
        )
    return header.index(column)


def _shown(text: str, limit: int = 60) -> str:
    """``text``, cut to ``limit`` characters for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _values(rows: list[list[str]], name: str, role: FileRole) -> np.ndarray:
    cells = [cell for row in rows for cell in row]
    shape = (len(rows), len(rows[0]))
    if not all(_number(cell) for cell in cells):
        return np.array(cells, dtype=str).reshape(shape)
    if all(_INTEGER.fullmatch(cell) for cell in cells):
        return _integers([int(cell) for cell in cells], name, role).reshape(shape)
    if role.kind == "labels":
        return _integers([_integral(cell, name, role) for cell in cells], name, role).reshape(shape)
    return np.array([float(cell) for cell in cells], dtype=np.float64).reshape(shape)


def _integers(values: list[int], name: str, role: FileRole) -> np.ndarray:
    low, high = min(values), max(values)
    if _INT64.min <= low and high <= _INT64.max:
        return np.array(values, dtype=np.int64)
    if low >= 0 and high <= _UINT64.max:
        return np.array(values, dtype=np.uint64)
    bad = low if low < _INT64.min else high
    raise CsvError(
        f"The {role.what} in '{name}' must be integers between {_INT64.min} and {_UINT64.max}. "
        f"Got {bad} instead."
    )


def _integral(cell: str, name: str, role: FileRole) -> int:
    """A label cell's exact integer: written as one, or a float that is one up to 2^53.

    The decimal text is read exactly (``Fraction``), so ``9.007199254740993e15`` is
    refused rather than rounded to its neighbour, and the rule matches ``.npy``/``.pt``.
    """
    if _INTEGER.fullmatch(cell):
        return int(cell)
    try:
        value = Fraction(cell)
    except (ValueError, OverflowError):  # inf, nan
        raise CsvError(float_label_message(name, cell, role)) from None
    if value.denominator != 1 or abs(value) > EXACT_FLOAT:
        raise CsvError(float_label_message(name, cell, role))
    return int(value)


def float_label_message(name: str, value: object, role: str | FileRole = "labels") -> str:
    """The one message for a float label (or group id, category: ``role``) that is not an
    exact integer, for every format."""
    role = as_role(role)
    return (
        f"The {role.what} in '{name}' must be integers or names; a float {role.singular} "
        "must be a whole "
        f"number no larger than 2^53 in magnitude (beyond it a float is not exact). "
        f"Got {value} instead."
    )


def _number(cell: str) -> bool:
    return _NUMBER.fullmatch(cell) is not None
