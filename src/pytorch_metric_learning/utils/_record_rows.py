"""Turning record rows into columns, with the name of 2.x's ``common_functions`` helper."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["sqlite_obj_to_dict"]


def sqlite_obj_to_dict(sqlite_obj: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows (dicts, as the hooks return them, or ``sqlite3.Row``s) to ``{column: [values]}``.

    The columns are those of the first row; ``{}`` for no rows (2.x raised ``IndexError``).

    Example:
        >>> sqlite_obj_to_dict([{"epoch": 1, "p": 0.5}, {"epoch": 2, "p": 0.7}])
        {'epoch': [1, 2], 'p': [0.5, 0.7]}
    """
    if len(sqlite_obj) == 0:
        return {}
    # .keys(): iterating a sqlite3.Row yields its values, not its column names
    columns = sqlite_obj[0].keys()  # noqa: SIM118
    return {key: [row[key] for row in sqlite_obj] for key in columns}
