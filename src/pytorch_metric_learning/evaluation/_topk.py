"""Row-wise top-k that reads most of each row with a cheap reduction.

Each row is cut into groups of ``_GROUP`` columns. The k groups with the best extreme
values hold every element of the row's true top k (an element outside them is beaten by
k group extremes from other groups), so the full top-k only runs on those ``k * _GROUP``
candidates plus the ragged tail. Min/max reductions without indices are several times
faster than ``torch.topk`` on CPU, which makes this about 1.2-4x faster for k << width.
"""

from __future__ import annotations

import torch

__all__ = ["topk"]

_GROUP = 32


def topk(values: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(values, indices)`` of the k largest (or smallest) entries of each row.

    Equal to ``torch.topk(values, k, dim=1, largest=largest)`` up to the order of ties.

    Example:
        >>> topk(torch.tensor([[3.0, 1.0, 2.0]]), 2, largest=False)[1].tolist()
        [[1, 2]]
    """
    if 4 * k * _GROUP > values.shape[1]:
        top = torch.topk(values, k, dim=1, largest=largest, sorted=True)
        return top.values, top.indices
    return _grouped_topk(values, k, largest)


def _grouped_topk(values: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, width = values.shape
    groups = width // _GROUP
    main = values[:, : groups * _GROUP].reshape(rows, groups, _GROUP)
    extremes = main.amax(dim=2) if largest else main.amin(dim=2)
    chosen = torch.topk(extremes, k, dim=1, largest=largest, sorted=False).indices
    offsets = torch.arange(_GROUP, device=values.device)
    candidate_index = (chosen.unsqueeze(2) * _GROUP + offsets).reshape(rows, k * _GROUP)
    row_starts = torch.arange(rows, device=values.device).unsqueeze(1) * width
    flat = values.contiguous().view(-1)  # one flat gather: faster than gather on 3-d views
    candidates = flat.index_select(0, (candidate_index + row_starts).view(-1)).view(rows, -1)
    if groups * _GROUP < width:
        tail = torch.arange(groups * _GROUP, width, device=values.device).expand(rows, -1)
        candidates = torch.cat([candidates, values[:, groups * _GROUP :]], dim=1)
        candidate_index = torch.cat([candidate_index, tail], dim=1)
    top = torch.topk(candidates, k, dim=1, largest=largest, sorted=True)
    return top.values, torch.gather(candidate_index, 1, top.indices)
