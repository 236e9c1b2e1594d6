"""Row-wise top-k, with a single reduction pass when only the best entry is wanted."""

from __future__ import annotations

import torch

__all__ = ["topk"]


def topk(values: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(values, indices)`` of the k largest (or smallest) entries of each row.

    Equal to ``torch.topk(values, k, dim=1, largest=largest)`` up to the order of ties;
    for ``k == 1`` a min/max reduction, about twice as fast on CPU.

    Example:
        >>> topk(torch.tensor([[3.0, 1.0, 2.0]]), 2, largest=False)[1].tolist()
        [[1, 2]]
    """
    if k == 1 and values.shape[1] > 0:
        best = values.max(dim=1, keepdim=True) if largest else values.min(dim=1, keepdim=True)
        return best.values, best.indices
    top = torch.topk(values, k, dim=1, largest=largest, sorted=True)
    return top.values, top.indices
