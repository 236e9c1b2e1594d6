"""Row-wise top-k that sorts a small fraction of each row: the k best groups, then their members.

Each row is cut into ``stride`` groups of ``GROUP`` strided columns (group j holds columns
``j, j + stride, j + 2 stride, ...``) and reduced to the minima of its groups, one
reduction along the memory layout. Every entry among the row's k smallest lies in a group
whose minimum is at most the k-th smallest entry, and at most k groups have such a minimum,
so the row's top k lie in the k groups with the smallest minima (ties aside, which may
order equal values differently): ``torch.topk`` over the ``stride`` minima, then over the
``GROUP * k`` members of those groups. The shapes are fixed, with no data-dependent
compaction; on a GPU the one wait for the device is a NaN check per block of rows. The
columns that do not fill a group are kept as candidates whole.
"""

from __future__ import annotations

import torch

__all__ = ["topk"]

GROUP = 8
# A row is grouped only when its groups are this many times k: narrower rows sort whole.
_GROUPS_PER_K = 4
# Rows selected at once, which bounds the candidates held at a time.
_ROWS = 256


def topk(values: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(values, indices)`` of the k largest (or smallest) entries of each row.

    Equal to ``torch.topk(values, k, dim=1, largest=largest)`` up to the order of ties.

    Example:
        >>> topk(torch.tensor([[3.0, 1.0, 2.0]]), 2, largest=False)[1].tolist()
        [[1, 2]]
    """
    if largest:
        top, indices = topk(values.neg(), k, largest=False)
        return top.neg_(), indices
    if not _grouped_pays(values.shape[1], k) or values.shape[0] == 0:
        return _whole(values, k)
    values = values.contiguous()
    if len(values) <= _ROWS:
        return _grouped_topk(values, k)
    parts = [_grouped_topk(values[r : r + _ROWS], k) for r in range(0, len(values), _ROWS)]
    return torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])


def _grouped_pays(width: int, k: int) -> bool:
    """Whether rows of ``width`` hold enough groups for selecting k of them to pay."""
    return width // GROUP >= _GROUPS_PER_K * k


def _whole(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    whole = torch.topk(values, k, dim=1, largest=False, sorted=True)
    return whole.values, whole.indices


def _grouped_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, width = values.shape
    stride = width // GROUP
    main = GROUP * stride
    grouped = values[:, :main].view(rows, GROUP, stride)
    minima = grouped.amin(dim=1)
    if bool(torch.isnan(minima.amax())):  # NaN hides its group's other entries: sort it all
        return _whole(values, k)
    groups = torch.topk(minima, k, dim=1, largest=False, sorted=False).indices
    members = torch.gather(grouped, 2, groups.unsqueeze(1).expand(rows, GROUP, k))
    candidates = members.view(rows, GROUP * k)
    if main < width:  # the columns left over by the groups are all candidates
        candidates = torch.cat([candidates, values[:, main:]], dim=1)
    top = torch.topk(candidates, k, dim=1, largest=False, sorted=True)
    return top.values, _columns(top.indices, groups, stride, main if main < width else None)


def _columns(
    picked: torch.Tensor, groups: torch.Tensor, stride: int, leftover: int | None
) -> torch.Tensor:
    """Row columns of the candidates at ``picked``: member g of selected group j is at
    ``g * k + j``; the leftover columns (from column ``leftover``, if any) follow the
    ``GROUP * k`` members."""
    k = groups.shape[1]
    member = picked if leftover is None else picked.clamp(max=GROUP * k - 1)
    column = (
        torch.gather(groups, 1, member.remainder(k)) + member.div(k, rounding_mode="floor") * stride
    )
    if leftover is None:
        return column
    return torch.where(picked < GROUP * k, column, picked - GROUP * k + leftover)
