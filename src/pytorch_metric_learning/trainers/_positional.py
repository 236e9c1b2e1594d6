"""Where the dataset and the miners are, in either positional order.

The spec (and 1.x) write ``MetricLossOnly(models, optimizers, batch_size, loss_funcs,
mining_funcs, dataset, ...)``; 2.x moved the dataset first and made the miners optional:
``MetricLossOnly(models, optimizers, batch_size, loss_funcs, dataset, mining_funcs=None)``.
Miners are always a mapping (or None) and a dataset never is, so the order is told apart
by the type of the first of the two positional arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError

NOT_GIVEN: Any = object()


def _is_miners(value: Any) -> bool:
    return value is None or isinstance(value, Mapping)


def _positional(args: tuple[Any, ...], owner: str) -> tuple[Any, Any]:
    """``(mining_funcs, dataset)`` from the positional arguments after ``loss_funcs``."""
    if len(args) > 2:
        raise InvalidTypeError(
            f"{owner} takes at most 2 positional arguments after loss_funcs "
            f"(mining_funcs and dataset, in either order); got {len(args)}. "
            "Pass the other options by keyword."
        )
    if len(args) == 2:
        return args if _is_miners(args[0]) else (args[1], args[0])
    if len(args) == 1:
        return (args[0], NOT_GIVEN) if _is_miners(args[0]) else (NOT_GIVEN, args[0])
    return NOT_GIVEN, NOT_GIVEN


def _one(name: str, positional: Any, keyword: Any, owner: str) -> Any:
    if positional is not NOT_GIVEN and keyword is not NOT_GIVEN:
        raise InvalidTypeError(f"{owner} got {name} both by position and by keyword.")
    return keyword if positional is NOT_GIVEN else positional


def miners_and_dataset(
    args: tuple[Any, ...], mining_funcs: Any, dataset: Any, owner: str
) -> tuple[Any, Any]:
    """Resolve ``(mining_funcs, dataset)``; miners default to None, the dataset is required."""
    positional_miners, positional_dataset = _positional(args, owner)
    miners = _one("mining_funcs", positional_miners, mining_funcs, owner)
    dataset = _one("dataset", positional_dataset, dataset, owner)
    if dataset is NOT_GIVEN or dataset is None:
        raise InvalidArgumentError(
            f"The 'dataset' parameter of {owner} must be a map-style dataset. Got "
            f"{'nothing' if dataset is NOT_GIVEN else 'None'} instead; pass it after "
            "loss_funcs (2.x order) or after mining_funcs."
        )
    return (None if miners is NOT_GIVEN else miners), dataset
