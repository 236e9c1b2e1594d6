"""Label maps and hierarchy levels with the names and behaviour of 2.x's ``common_functions``.

Re-exported by :mod:`pytorch_metric_learning.utils.common_functions`. The testers' own
remapping is :class:`pytorch_metric_learning.testers.LabelMapper`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from .._validation import invalid
from ..errors import InvalidArgumentError
from ._tensor_helpers import is_list_or_tuple, numpy_to_torch, to_numpy

__all__ = [
    "get_labels_to_indices",
    "make_label_to_rank_dict",
    "get_label_map",
    "get_hierarchy_label",
    "map_labels",
    "process_label",
]


def get_labels_to_indices(labels: Any) -> defaultdict[Any, np.ndarray]:
    """Map each label to the array of positions where it occurs (2.x's samplers and the
    Inference notebook use it to pick examples by class).

    ``labels`` is a sequence, a NumPy array or a tensor (read on the CPU); the keys are its
    elements (NumPy scalars for arrays and tensors), in order of first occurrence.

    Example:
        >>> mapping = get_labels_to_indices([3, 1, 3])
        >>> {int(k): v.tolist() for k, v in mapping.items()}
        {3: [0, 2], 1: [1]}
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.cpu().numpy()
    positions: defaultdict[Any, list[int]] = defaultdict(list)
    for index, label in enumerate(labels):
        positions[label].append(index)
    return defaultdict(list, {k: np.array(v, dtype=int) for k, v in positions.items()})


def make_label_to_rank_dict(label_set: Sequence[Any]) -> dict[Any, int]:
    """Map each label of a duplicate-free sequence to its rank in sorted order.

    Example:
        >>> make_label_to_rank_dict([30, 10, 20])
        {30: 2, 10: 0, 20: 1}
    """
    if len(set(label_set)) != len(label_set):
        raise InvalidArgumentError(
            "The 'label_set' parameter of make_label_to_rank_dict must not have duplicates. "
            f"Got {len(label_set)} labels, {len(set(label_set))} of them distinct, instead."
        )
    order = np.argsort(np.asarray(label_set), kind="stable")
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return {label: int(rank) for label, rank in zip(label_set, ranks)}


def get_label_map(labels: Any) -> dict[int, dict[Any, int]]:
    """``{hierarchy level: {label: rank}}`` for 1-D labels (level 0) or each column of 2-D.

    Example:
        >>> get_label_map([[5, 1], [3, 1], [5, 7]])
        {0: {3: 0, 5: 1}, 1: {1: 0, 7: 1}}
    """
    array = np.array(labels)
    columns = array.reshape(len(array), -1) if array.ndim == 2 else array[:, None]
    return {
        level: make_label_to_rank_dict(sorted(set(columns[:, level].tolist())))
        for level in range(columns.shape[1])
    }


def get_hierarchy_label(batch_labels: Any, hierarchy_level: int | Sequence[int] | str) -> Any:
    """The column(s) ``hierarchy_level`` of 2-D labels; ``"all"`` or 1-D labels unchanged.

    Example:
        >>> get_hierarchy_label(np.array([[1, 7], [2, 8]]), 1).tolist()
        [7, 8]
    """
    if hierarchy_level == "all":
        return batch_labels
    levels: list[Any] = (
        list(hierarchy_level) if isinstance(hierarchy_level, (list, tuple)) else [hierarchy_level]
    )
    highest = max(int(level) for level in levels)
    if highest > 0 and not (batch_labels.ndim == 2 and batch_labels.shape[1] > highest):
        raise invalid(
            "hierarchy_level",
            "get_hierarchy_label",
            "a column of the 2-D labels",
            f"{hierarchy_level} for labels of shape {tuple(batch_labels.shape)}",
        )
    if batch_labels.ndim == 2:
        return batch_labels[:, hierarchy_level]
    return batch_labels


def map_labels(label_map: Callable[[Any, int], Any], labels: Any) -> np.ndarray:
    """Apply ``label_map(labels_of_level, level)`` to each hierarchy level of ``labels``.

    A list or tuple of 1-D label tensors is stacked as columns first.

    Example:
        >>> map_labels(lambda labels, level: labels * 10 + level, np.array([[1, 2], [3, 4]]))
        array([[10, 21],
               [30, 41]])
    """
    if is_list_or_tuple(labels):
        labels = np.stack([to_numpy(column) for column in labels], axis=1)
    else:
        labels = to_numpy(labels)
    if labels.ndim != 2:
        return np.asarray(to_numpy(label_map(labels, 0)))
    mapped = np.zeros(labels.shape, dtype=int)
    for level in range(labels.shape[1]):  # one call per hierarchy level, not per label
        mapped[:, level] = to_numpy(label_map(labels[:, level], level))
    return mapped


def process_label(
    labels: Any, hierarchy_level: int | Sequence[int] | str, label_map: Callable[[Any, int], Any]
) -> Any:
    """Map labels with ``label_map``, pick ``hierarchy_level`` and return a tensor.

    Example:
        >>> process_label(np.array([[4, 9], [6, 9]]), 0, lambda labels, level: labels // 2)
        tensor([2, 3])
    """
    return numpy_to_torch(get_hierarchy_label(map_labels(label_map, labels), hierarchy_level))
