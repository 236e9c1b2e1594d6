"""Find the accuracy key that stands for a metric name, and keep only the numbers of a table."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["resolve_metric_key", "numeric_accuracies", "is_better"]

# Entries of a tester's accuracy table that are bookkeeping, not metrics.
_NOT_METRICS = frozenset({"epoch"})


def resolve_metric_key(metric: str, keys: Iterable[str]) -> str | None:
    """The key among ``keys`` that holds ``metric``, or None.

    Testers name their results ``<metric>_level<L>`` (``AVERAGE_<metric>`` when several
    hierarchy levels are evaluated, with ``_pca<N>`` appended after PCA). An exact match
    wins, then the ``AVERAGE_`` key, then the lowest level.

    Example:
        >>> keys = ["precision_at_1_level0", "mean_average_precision_at_r_level0"]
        >>> resolve_metric_key("mean_average_precision_at_r", keys)
        'mean_average_precision_at_r_level0'
        >>> resolve_metric_key("mean_average_precision", keys) is None
        True
    """
    keys = list(keys)
    if metric in keys:
        return metric
    pattern = re.compile(rf"(AVERAGE_)?{re.escape(metric)}(?:_level(\d+))?(?:_pca\d+)?")
    found = [(key, match) for key in keys if (match := pattern.fullmatch(key))]
    if not found:
        return None

    def rank(item: tuple[str, re.Match[str]]) -> tuple[bool, int, str]:
        key, match = item
        return (match.group(1) is None, int(match.group(2) or -1), key)

    return min(found, key=rank)[0]


def _as_number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def numeric_accuracies(accuracies: Mapping[str, Any]) -> dict[str, float]:
    """The metric values of one split's accuracy table, as floats.

    Drops the ``epoch`` entry and anything that is not a single real number.

    Example:
        >>> numeric_accuracies({"epoch": 3, "precision_at_1_level0": 0.5, "note": "x"})
        {'precision_at_1_level0': 0.5}
    """
    out = {}
    for key, value in accuracies.items():
        number = _as_number(value)
        if key not in _NOT_METRICS and number is not None:
            out[str(key)] = number
    return out


def is_better(value: float, best: float | None) -> bool:
    """Whether ``value`` beats ``best``: strictly greater, and never NaN.

    Example:
        >>> is_better(0.5, None), is_better(0.5, 0.5), is_better(math.nan, None)
        (True, False, False)
    """
    return not math.isnan(value) and (best is None or value > best)
