"""Label tables reduced across ranks: distinct labels with their counts over every shard.

A table has one row per distinct label (or label row), so its size is the number of
classes, not of samples. The same reduction of integer keys gives the sparse contingency
table of two labelings (key = class id * number of clusters + cluster id).
"""

from __future__ import annotations

import torch

from ._collectives import Comm, all_gather_ints, all_gather_rows

__all__ = ["counts_of", "global_label_counts", "index_in"]


def _unique(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted distinct labels (rows for 2-D labels), each label's index, and counts."""
    dim = 0 if labels.ndim > 1 else None
    unique, inverse, counts = torch.unique(
        labels, sorted=True, return_inverse=True, return_counts=True, dim=dim
    )
    return unique, inverse, counts


def global_label_counts(
    comm: Comm, labels: torch.Tensor, stage: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct labels of every rank's ``labels`` (sorted) and how often each occurs.

    Every rank must pass labels of the same dtype and trailing shape (check that first).
    Returns the same ``(unique, counts)`` on every rank, on ``labels``' device.
    """
    unique, _, counts = _unique(labels)
    sizes = all_gather_ints(comm, [len(unique)], f"{stage} (sizes)")[:, 0].tolist()
    every_unique = all_gather_rows(comm, unique, sizes, stage).to(labels.device)
    every_count = all_gather_rows(comm, counts, sizes, stage).to(labels.device)
    merged, inverse, _ = _unique(every_unique)
    totals = torch.zeros(len(merged), dtype=torch.long, device=labels.device)
    totals.index_add_(0, inverse, every_count)
    return merged, totals


def index_in(unique: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Position of each of ``labels`` in the sorted distinct ``unique`` (all must occur).

    Example:
        >>> index_in(torch.tensor([2, 5, 9]), torch.tensor([9, 2, 9])).tolist()
        [2, 0, 2]
    """
    if labels.ndim == 1:
        return torch.searchsorted(unique, labels.contiguous())
    _, inverse, _ = _unique(torch.cat([unique, labels]))
    # ``unique`` is sorted and distinct, so its own rows map to 0..len(unique)-1 in order.
    return inverse[len(unique) :]


def counts_of(unique: torch.Tensor, counts: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How often each of ``labels`` occurs according to the table ``(unique, counts)``."""
    dim = 0 if labels.ndim > 1 else None
    _, inverse = torch.unique(torch.cat([unique, labels]), return_inverse=True, dim=dim)
    table = torch.zeros(int(inverse.max()) + 1 if inverse.numel() else 0, dtype=torch.long,
                        device=labels.device)  # fmt: skip
    table[inverse[: len(unique)]] = counts
    return table[inverse[len(unique) :]]
