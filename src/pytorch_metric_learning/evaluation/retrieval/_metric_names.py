"""Metric names with a cutoff in them: ``recall_at_4``, ``ndcg_at_100``, ...

Papers report retrieval at fixed cutoffs (R@1/2/4/8 on CUB-200 and Cars196, R@1/10/100/1000
on Stanford Online Products), so the calculator accepts any name ``<family>_at_<K>`` with a
positive integer ``K`` instead of one method per cutoff. This module parses such names and
maps every k-NN metric name (built-in or parametrized) to its per-query function of
``(relevance, num_relevant)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..._metric_catalog import FAMILIES, describe_families, parametrized_parts
from . import metrics

__all__ = [
    "FAMILIES",
    "ParametrizedMetric",
    "parse_metric_name",
    "per_query_function",
    "describe_families",
]

PerQueryFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Per-query values of the built-in k-NN metrics, from (relevance, R).
_BUILTIN: dict[str, PerQueryFunction] = {
    "precision_at_1": lambda relevance, _: metrics.precision_at_1(relevance),
    "r_precision": metrics.r_precision,
    "mean_average_precision_at_r": metrics.mean_average_precision_at_r,
    "mean_average_precision": metrics.mean_average_precision,
    "mean_reciprocal_rank": lambda relevance, _: metrics.mean_reciprocal_rank(relevance),
    "mean_inverse_negative_penalty": metrics.mean_inverse_negative_penalty,
}


@dataclass(frozen=True)
class ParametrizedMetric:
    """One metric family at one cutoff, e.g. ``ParametrizedMetric("recall", 4)``.

    Attributes:
        family: ``"recall"``, ``"precision"``, ``"mean_average_precision"`` or ``"ndcg"``.
        k: The cutoff: how many nearest neighbours the metric looks at.
    """

    family: str
    k: int

    @property
    def name(self) -> str:
        return f"{self.family}_at_{self.k}"

    def __call__(self, relevance: torch.Tensor, num_relevant: torch.Tensor) -> torch.Tensor:
        """Per-query values from a relevance matrix with at least ``min(k, available)`` columns."""
        if self.family == "recall":
            return metrics.recall_at_k(relevance, self.k)
        if self.family == "precision":
            return metrics.precision_at_k(relevance, self.k)
        if self.family == "mean_average_precision":
            return metrics.mean_average_precision_at_k(relevance, num_relevant, self.k)
        return metrics.ndcg_at_k(relevance, num_relevant, self.k)


def parse_metric_name(name: object) -> ParametrizedMetric | None:
    """The family and cutoff of a parametrized name, ``None`` for any other name.

    Example:
        >>> parse_metric_name("recall_at_8")
        ParametrizedMetric(family='recall', k=8)
        >>> parse_metric_name("mean_average_precision_at_r") is None
        True
    """
    parts = parametrized_parts(name)
    return None if parts is None else ParametrizedMetric(*parts)


def per_query_function(name: str) -> PerQueryFunction | None:
    """The per-query function of a built-in or parametrized k-NN metric, else ``None``.

    Example:
        >>> relevance = torch.tensor([[False, True], [False, False]])
        >>> per_query_function("recall_at_2")(relevance, torch.tensor([1, 1])).tolist()
        [1.0, 0.0]
    """
    return _BUILTIN.get(name) or parse_metric_name(name)
