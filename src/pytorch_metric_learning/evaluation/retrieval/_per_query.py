"""Per-query values of the k-NN metrics, kept instead of averaged.

An average hides which queries fail and how noisy it is. Keeping one float64 value per
non-lone query lets users slice by class, list failure cases, and bootstrap intervals
(:mod:`.bootstrap`) from the same numbers the averages come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ._metric_names import per_query_function

__all__ = ["PerQueryValues", "collect_per_query", "per_query_values"]


@dataclass
class PerQueryValues:
    """Each k-NN metric's value for every non-lone query.

    Attributes:
        query_indices: Long tensor: the rows of the query that have at least one relevant
            reference (lone queries have no value), in increasing order.
        query_labels: The labels of those queries (for slicing or resampling by class).
        values: ``{metric name: float64 tensor}``, aligned with ``query_indices``; its mean
            is the metric as ``get_accuracy`` reports it without ``avg_of_avgs``.
    """

    query_indices: torch.Tensor
    query_labels: torch.Tensor
    values: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.query_indices)


def per_query_values(
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    relevance: torch.Tensor,
    num_relevant: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """Apply a per-query metric in row blocks of about ``block`` relevance elements."""
    rows = max(1, block // max(1, relevance.shape[1]))
    return torch.cat(
        [
            metric(relevance[start : start + rows], num_relevant[start : start + rows])
            for start in range(0, len(relevance), rows)
        ]
    )


def collect_per_query(names: list[str], kwargs: dict[str, Any], block: int) -> PerQueryValues:
    """Per-query values of the named built-in or parametrized metrics from the k-NN outputs."""
    query_labels = kwargs["query_labels"]
    stats = kwargs.get("label_stats")
    if stats is None:  # no k-NN metric was selected
        empty = torch.zeros(0, dtype=torch.long, device=query_labels.device)
        return PerQueryValues(empty, query_labels[:0])
    keep = stats.not_lone
    relevance, num_relevant = kwargs["relevance"][keep], stats.num_relevant[keep]
    values = {}
    for name in names:
        metric = per_query_function(name)
        if metric is not None:
            values[name] = (
                per_query_values(metric, relevance, num_relevant, block)
                if len(relevance)
                else torch.zeros(0, dtype=torch.float64, device=relevance.device)
            )
    return PerQueryValues(keep.nonzero().flatten(), query_labels[keep], values)
