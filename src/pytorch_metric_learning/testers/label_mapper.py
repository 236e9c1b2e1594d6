"""Remap dataset labels (integers, sparse ids or strings) to consecutive ints by rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._validation import invalid
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["LabelMapper"]

_OWNER = "LabelMapper"


class LabelMapper:
    """Maps each label to its rank among the unique labels of the whole dataset.

    With ``set_min_label_to_zero=True`` the labels ``[10, 30, 20]`` become ``[0, 2, 1]``
    and ``["dog", "cat"]`` becomes ``[1, 0]``: every label of one hierarchy level is
    replaced by its position in the sorted unique values of that level of
    ``dataset_labels``. The map is fixed by ``dataset_labels``, so query and reference
    splits that are mapped separately stay consistent. With ``set_min_label_to_zero=False``
    labels pass through unchanged.

    Args:
        set_min_label_to_zero: Whether to remap labels at all.
        dataset_labels: Every label of the dataset, shaped ``(num_samples,)`` for one level
            or ``(num_samples, num_levels)`` for a label hierarchy. Required when
            ``set_min_label_to_zero`` is true.

    Example:
        >>> mapper = LabelMapper(True, ["dog", "cat", "dog", "owl"])
        >>> mapper.map(["owl", "dog", "cat"]).tolist()
        [2, 1, 0]
    """

    def __init__(self, set_min_label_to_zero: bool = False, dataset_labels: Any = None) -> None:
        if not isinstance(set_min_label_to_zero, bool):
            raise invalid(
                "set_min_label_to_zero", _OWNER, "a bool", set_min_label_to_zero, InvalidTypeError
            )
        self.set_min_label_to_zero = set_min_label_to_zero
        self.label_map: dict[int, np.ndarray] = {}
        if dataset_labels is not None:
            self.label_map = _unique_per_level(_as_array(dataset_labels, "dataset_labels"))
        elif set_min_label_to_zero:
            raise invalid(
                "dataset_labels",
                _OWNER,
                "every label of the dataset when set_min_label_to_zero is True",
                None,
            )

    def __repr__(self) -> str:
        levels = {level: len(keys) for level, keys in self.label_map.items()}
        return f"LabelMapper(set_min_label_to_zero={self.set_min_label_to_zero}, levels={levels})"

    def map(self, labels: Any, hierarchy_level: int = 0) -> torch.Tensor:
        """Return ``labels`` of one hierarchy level as their ranks (a ``torch.long`` tensor).

        Args:
            labels: A 1-D tensor, array or sequence of labels of level ``hierarchy_level``.
            hierarchy_level: Which column of ``dataset_labels`` defines the ranks.

        Returns:
            The mapped labels, on the input tensor's device (CPU otherwise). When
            ``set_min_label_to_zero`` is false, ``labels`` as a tensor, unchanged.

        Example:
            >>> LabelMapper(True, [[7, 1], [3, 1], [7, 5]]).map([7, 3], hierarchy_level=0).tolist()
            [1, 0]
        """
        device = labels.device if isinstance(labels, torch.Tensor) else torch.device("cpu")
        if not self.set_min_label_to_zero:
            return labels if isinstance(labels, torch.Tensor) else torch.as_tensor(labels)
        keys = self._keys(hierarchy_level)
        values = _as_array(labels, "labels")
        if _kind(values) != _kind(keys):
            raise invalid(
                "labels",
                f"{_OWNER}.map",
                f"labels of the same kind as dataset_labels ({keys.dtype})",
                f"labels of dtype {values.dtype}",
            )
        ranks = np.searchsorted(keys, values)
        found = ranks < len(keys)
        found[found] = keys[ranks[found]] == values[found]
        if not found.all():
            unknown = np.unique(values[~found])[:5].tolist()
            raise InvalidArgumentError(
                f"The 'labels' parameter of {_OWNER}.map must hold labels of dataset_labels "
                f"(level {hierarchy_level}). Got unknown labels {unknown} instead; pass every "
                "label of the dataset as dataset_labels."
            )
        return torch.as_tensor(ranks, dtype=torch.long, device=device)

    def _keys(self, hierarchy_level: int) -> np.ndarray:
        if hierarchy_level not in self.label_map:
            raise invalid(
                "hierarchy_level",
                f"{_OWNER}.map",
                f"a level of dataset_labels (0 to {len(self.label_map) - 1})",
                hierarchy_level,
            )
        return self.label_map[hierarchy_level]


def _as_array(labels: Any, param: str) -> np.ndarray:
    """Labels as a NumPy array; tensors are copied to the CPU first."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim not in (1, 2) or array.dtype == object:
        raise invalid(
            param, _OWNER, "1-D or 2-D labels of one type", f"shape {array.shape} ({array.dtype})"
        )
    return array


def _kind(array: np.ndarray) -> str:
    """'text' for string arrays, 'number' for numeric and boolean ones."""
    return "text" if array.dtype.kind in "US" else "number"


def _unique_per_level(dataset_labels: np.ndarray) -> dict[int, np.ndarray]:
    """The sorted unique labels of each hierarchy level."""
    columns = dataset_labels.reshape(len(dataset_labels), -1)
    return {level: np.unique(columns[:, level]) for level in range(columns.shape[1])}
