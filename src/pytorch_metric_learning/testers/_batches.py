"""Read one DataLoader batch: check its shape and turn its labels into a 2-D tensor."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import InvalidArgumentError, InvalidTypeError
from .label_mapper import LabelMapper

__all__ = ["unpack_batch", "batch_labels"]


def unpack_batch(
    batch: Any,
    getter: Callable[[Any], Any] | None,
    layout: str,
    split_name: str,
) -> tuple[Any, ...]:
    """Split a batch into its parts, e.g. ``(data, labels)`` for ``layout="(data, label)"``.

    The number of parts is the number of names in ``layout``. Without a ``getter`` the
    batch itself must be a list or tuple of that many parts, as the default ``collate_fn``
    makes of dataset items shaped like ``layout``.
    """
    num_parts = layout.count(",") + 1
    parts = batch if getter is None else getter(batch)
    if isinstance(parts, (list, tuple)) and len(parts) == num_parts:
        return tuple(parts)
    source = "the data_and_label_getter's result" if getter else "each item"
    got = type(parts).__name__
    if isinstance(parts, (list, tuple)):
        got = f"{got} of length {len(parts)}"
    raise InvalidArgumentError(
        f"In split {split_name!r}, {source} must be shaped {layout}. Got a batch that is a "
        f"{got} instead; make __getitem__ return {layout} or pass data_and_label_getter."
    )


def batch_labels(raw: Any, mapper: LabelMapper, split_name: str) -> torch.Tensor:
    """The labels of one batch as a ``(batch, num_levels)`` tensor, remapped by ``mapper``."""
    columns = _label_columns(raw, split_name)
    if mapper.set_min_label_to_zero:
        mapped = [mapper.map(columns[:, level], level) for level in range(columns.shape[1])]
        return torch.stack(mapped, dim=1)
    if isinstance(columns, np.ndarray):
        if columns.dtype.kind not in "biuf":
            raise InvalidTypeError(
                f"The labels of split {split_name!r} must be numeric. Got labels of dtype "
                f"{columns.dtype} instead; pass set_min_label_to_zero=True and dataset_labels "
                "to map them to integers."
            )
        return torch.from_numpy(columns)
    return columns


def _label_columns(raw: Any, split_name: str) -> torch.Tensor | np.ndarray:
    """Labels as (batch, levels): a tensor when they arrive as one, else a NumPy array."""
    if isinstance(raw, (torch.Tensor, np.ndarray)):
        columns = raw.reshape(1, 1) if raw.ndim == 0 else raw
    elif isinstance(raw, (list, tuple)) and raw and all(_is_scalar(x) for x in raw):
        columns = np.asarray([x.item() if isinstance(x, torch.Tensor) else x for x in raw])
    elif isinstance(raw, (list, tuple)) and raw:
        columns = np.stack([_column(level, split_name) for level in raw], axis=1)
    else:
        raise _bad_labels(split_name, f"a {type(raw).__name__}")
    if columns.ndim == 1:
        columns = columns.reshape(-1, 1)
    if columns.ndim != 2 or columns.shape[1] == 0:
        raise _bad_labels(split_name, f"shape {tuple(columns.shape)}")
    return columns


def _column(level: Any, split_name: str) -> np.ndarray:
    """One hierarchy level of a batch (the default collate_fn transposes label tuples)."""
    if isinstance(level, torch.Tensor):
        level = level.detach().cpu().numpy()
    column = np.asarray(level)
    if column.ndim != 1:
        raise _bad_labels(split_name, f"a level of shape {column.shape}")
    return column


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.ndim == 0
    return isinstance(value, (str, bytes, numbers.Number, np.generic))


def _bad_labels(split_name: str, got: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"The labels of split {split_name!r} must be one label per item, or one row of "
        f"labels per item for a label hierarchy. Got {got} instead."
    )
