"""Helpers with the signatures of pytorch-metric-learning 2.x, for subclasses written for it.

2.x users wrote metrics such as::

    def calculate_precision_at_5(self, knn_labels, query_labels, **kwargs):
        return accuracy_calculator.precision_at_k(
            knn_labels, query_labels[:, None], 5, self.avg_of_avgs,
            self.return_per_class, self.label_comparison_fn)

These functions keep that call shape; ``utils.accuracy_calculator`` re-exports them.
"""

from __future__ import annotations

from typing import Any

import torch

from . import metrics
from ._label_stats import LabelComparison

__all__ = ["maybe_get_avg_of_avgs", "precision_at_k", "try_getting_not_lone_labels"]


def maybe_get_avg_of_avgs(
    accuracy_per_sample: torch.Tensor,
    sample_labels: torch.Tensor,
    avg_of_avgs: bool,
    return_per_class: bool = False,
) -> Any:
    """Average per sample, per label then over labels, or per label (ordered by label).

    Example:
        >>> values = torch.tensor([1.0, 0.0, 1.0])
        >>> maybe_get_avg_of_avgs(values, torch.tensor([[0], [0], [1]]), avg_of_avgs=True)
        0.75
    """
    values = accuracy_per_sample.to(torch.float64)
    if not (avg_of_avgs or return_per_class):
        return metrics.average(values)
    rows = sample_labels.reshape(len(sample_labels), -1)
    classes, class_ids = torch.unique(rows, dim=0, return_inverse=True)
    per_class = metrics.average_per_class(values, class_ids, len(classes))
    return per_class.tolist() if return_per_class else metrics.average(per_class)


def precision_at_k(
    knn_labels: torch.Tensor,
    gt_labels: torch.Tensor,
    k: int,
    avg_of_avgs: bool,
    return_per_class: bool,
    label_comparison_fn: LabelComparison = torch.eq,
) -> Any:
    """Fraction of the first ``k`` neighbours whose label matches, averaged as in 2.x.

    ``gt_labels`` is ``query_labels[:, None]``, as 2.x code passes it.

    Example:
        >>> knn_labels = torch.tensor([[0, 1], [1, 1]])
        >>> precision_at_k(knn_labels, torch.tensor([[0], [1]]), 2, False, False)
        0.75
    """
    same = label_comparison_fn(gt_labels, knn_labels[:, :k])
    if same.ndim > 2:  # multi-dimensional labels compared with plain equality
        same = same.reshape(*same.shape[:2], -1).all(dim=2)
    values = same.sum(dim=1).to(torch.float64) / k
    return maybe_get_avg_of_avgs(values, gt_labels, avg_of_avgs, return_per_class)


def try_getting_not_lone_labels(
    knn_labels: torch.Tensor, query_labels: torch.Tensor, not_lone_query_mask: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The rows of non-lone queries, or ``(None, None)`` when every query is lone.

    Example:
        >>> mask = torch.tensor([True, False])
        >>> try_getting_not_lone_labels(torch.tensor([[1], [2]]), torch.tensor([1, 3]), mask)
        (tensor([[1]]), tensor([1]))
    """
    if not bool(not_lone_query_mask.any()):
        return None, None
    return knn_labels[not_lone_query_mask], query_labels[not_lone_query_mask]
