"""Checks for the options of the testers' constructors."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Union

import torch

from .._validation import invalid
from ..errors import InvalidTypeError

__all__ = [
    "check_bool",
    "check_callable",
    "check_device",
    "check_dtype",
    "check_label_hierarchy_level",
    "check_non_negative_int",
    "check_accuracy_calculator",
    "check_visualizer",
]

LabelLevels = Union[int, str, list[int]]


def check_bool(value: Any, param: str, owner: str) -> bool:
    """Return ``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise invalid(param, owner, "a bool", value, InvalidTypeError)
    return value


def check_non_negative_int(value: Any, param: str, owner: str) -> int:
    """Return ``value`` as an int if it is an integer >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(param, owner, "an int >= 0", value, InvalidTypeError)
    if value < 0:
        raise invalid(param, owner, "an int >= 0", value)
    return int(value)


def check_callable(value: Any, param: str, owner: str) -> Any:
    """Return ``value`` if it is None or callable."""
    if value is not None and not callable(value):
        raise invalid(param, owner, "None or a callable", value, InvalidTypeError)
    return value


def check_device(value: Any, param: str, owner: str) -> torch.device | None:
    """``value`` as a ``torch.device``; None stays None."""
    if value is None or isinstance(value, torch.device):
        return value
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise invalid(
            param, owner, "None, a torch.device or a device string", value, InvalidTypeError
        )
    try:
        return torch.device(value)
    except RuntimeError as error:
        raise invalid(param, owner, "a device such as 'cpu' or 'cuda:0'", value) from error


def check_dtype(value: Any, param: str, owner: str) -> torch.dtype | None:
    """Return ``value`` if it is None or a floating-point ``torch.dtype``."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise invalid(param, owner, "None or a floating-point torch.dtype", value, InvalidTypeError)
    return value


def check_label_hierarchy_level(value: Any, owner: str) -> LabelLevels:
    """``value`` if it is an int >= 0 or "all", else a list copy of a list of such ints."""
    expected = 'an int >= 0, "all", or a non-empty list of distinct ints >= 0'
    if isinstance(value, str):
        if value != "all":
            raise invalid("label_hierarchy_level", owner, expected, value)
        return value
    if isinstance(value, Sequence):
        levels = [check_non_negative_int(level, "label_hierarchy_level", owner) for level in value]
        if not levels or len(set(levels)) != len(levels):
            raise invalid("label_hierarchy_level", owner, expected, value)
        return levels
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid("label_hierarchy_level", owner, expected, value, InvalidTypeError)
    return check_non_negative_int(value, "label_hierarchy_level", owner)


def check_accuracy_calculator(value: Any, owner: str) -> Any:
    """Return ``value`` if it has a callable ``get_accuracy``."""
    if not callable(getattr(value, "get_accuracy", None)):
        raise invalid(
            "accuracy_calculator",
            owner,
            "None or an object with a get_accuracy method (an AccuracyCalculator)",
            value,
            InvalidTypeError,
        )
    return value


def check_visualizer(visualizer: Any, hook: Any, owner: str) -> None:
    """A visualizer needs ``fit_transform`` and a hook to receive its output."""
    check_callable(hook, "visualizer_hook", owner)
    if visualizer is None:
        return
    if not callable(getattr(visualizer, "fit_transform", None)):
        raise invalid(
            "visualizer",
            owner,
            "None or an object with fit_transform",
            visualizer,
            InvalidTypeError,
        )
    if hook is None:
        raise invalid(
            "visualizer_hook",
            owner,
            "a callable when visualizer is set (it receives the visualizer's output)",
            hook,
        )
