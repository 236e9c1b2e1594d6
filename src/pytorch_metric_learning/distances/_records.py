"""2.x's recordable-attribute bookkeeping: the names of a module's values worth logging.

pytorch-metric-learning 2.x kept, on each distance (and loss, miner), two lists of
attribute names: ``_record_these`` (settings such as ``p`` and ``power``) and
``_record_these_stats`` (per-call statistics, zeroed by ``reset_stats``). Code written
for 2.x calls ``self.add_to_recordable_attributes(...)`` in ``__init__`` and reads the
lists, so they are kept with 2.x's semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "add_to_recordable_attributes",
    "list_of_recordable_attributes_list_names",
    "reset_stats",
]

_SETTINGS_LIST = "_record_these"
_STATS_LIST = "_record_these_stats"


def add_to_recordable_attributes(
    input_obj: Any,
    name: str | None = None,
    list_of_names: Sequence[str] | None = None,
    is_stat: bool = False,
) -> None:
    """Record attribute names on ``input_obj`` as 2.x did.

    Each name joins ``_record_these_stats`` when ``is_stat``, else ``_record_these``
    (once), and the attribute is set to 0 when ``input_obj`` does not have it yet.

    Example:
        >>> class Holder:
        ...     pass
        >>> holder = Holder()
        >>> add_to_recordable_attributes(holder, list_of_names=["hits"], is_stat=True)
        >>> holder._record_these_stats, holder.hits
        (['hits'], 0)
    """
    list_name = _STATS_LIST if is_stat else _SETTINGS_LIST
    if not hasattr(input_obj, list_name):
        setattr(input_obj, list_name, [])
    names: list[str] = getattr(input_obj, list_name)
    if name is not None:
        if name not in names:
            names.append(name)
        if not hasattr(input_obj, name):
            setattr(input_obj, name, 0)
    if isinstance(list_of_names, (list, tuple)):
        for each in list_of_names:
            add_to_recordable_attributes(input_obj, name=each, is_stat=is_stat)


def reset_stats(input_obj: Any) -> None:
    """Set every attribute named in ``input_obj._record_these_stats`` to 0."""
    for name in getattr(input_obj, _STATS_LIST, []):
        setattr(input_obj, name, 0)


def list_of_recordable_attributes_list_names() -> list[str]:
    """The names of the two lists: ``["_record_these", "_record_these_stats"]``."""
    return [_SETTINGS_LIST, _STATS_LIST]
