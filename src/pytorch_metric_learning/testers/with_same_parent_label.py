"""Score hierarchical labels: a query is searched only among samples of its parent label."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .._warnings import warn_external
from ..errors import InvalidArgumentError
from ._scored_pair import ScoredPair
from .base_tester import BaseTester

__all__ = ["WithSameParentLabelTester"]


class WithSameParentLabelTester(BaseTester):
    """Measures how well fine labels separate inside each coarse (parent) label.

    Labels are 2-D, ``(num_samples, num_levels)``; column ``L + 1`` is the parent of
    column ``L``, so only levels ``0`` to ``num_levels - 2`` can be evaluated ("all" means
    exactly those). For each unique parent label of the query split, the queries and
    references with that parent are scored on their own, and each metric is averaged
    over the parents. A parent whose metric is NaN (all its queries are lone: no
    reference shares their label, or it has no reference at all) is left out of that
    metric's average, with a warning.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
        >>> fine = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
        >>> labels = torch.stack([fine, fine // 2], dim=1)  # parents: {0, 1} and {2, 3}
        >>> data = torch.eye(4)[fine] + 0.05 * torch.arange(8.0)[:, None]
        >>> tester = WithSameParentLabelTester(
        ...     accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        ...     dataloader_num_workers=0, data_device="cpu", progress_bar=False)
        >>> dict(tester.test({"val": TensorDataset(data, labels)}, 1, torch.nn.Identity()))
        {'val': {'epoch': 1, 'precision_at_1_level0': 1.0}}
    """

    def _evaluable_levels(self, num_levels: int) -> int:
        """Levels that have a parent column: at most ``num_levels - 2``.

        Example:
            >>> import torch
            >>> tester = WithSameParentLabelTester(label_hierarchy_level="all")
            >>> tester.label_levels_to_evaluate(torch.zeros(4, 3, dtype=torch.long), "val")
            [0, 1]
        """
        return num_levels - 1

    def _levels_error(self, num_levels: int, split_name: str) -> str:
        return (
            f"{self._owner} needs a parent label column for every evaluated level: with "
            f"the {num_levels} label level(s) of split {split_name!r}, "
            f"label_hierarchy_level={self.label_hierarchy_level!r} must be at most "
            f"{num_levels - 2} (column L + 1 is the parent of level L). Pass labels "
            "shaped (num_samples, num_levels) with the parents in the next column."
        )

    def score_level(self, pair: ScoredPair, level: int) -> dict[str, Any]:
        """Every metric of ``level``, averaged over the parent labels of the queries."""
        if getattr(self, "category_level", None) is not None:
            raise InvalidArgumentError(
                f"The 'category_level' attribute is not supported by {self._owner}: its "
                "metrics are averages over parent labels, with no per-category breakdown. "
                "Set it to None, or use GlobalEmbeddingSpaceTester for per-category results."
            )
        query_parents = pair.query_labels[:, level + 1]
        reference_parents = pair.reference_labels[:, level + 1]
        per_parent: dict[Any, dict[str, Any]] = {}
        parents, has_reference = self._parents(query_parents, reference_parents)
        for parent, referenced in zip(parents, has_reference.tolist()):
            in_query = query_parents == parent
            in_reference = reference_parents == parent
            if not referenced:
                per_parent[parent.item()] = {}
                continue
            per_parent[parent.item()] = self.accuracy_calculator.get_accuracy(
                **pair.accuracy_arguments(level, in_query, in_reference)
            )
        return _average_over_parents(per_parent, level)

    def _parents(
        self, query_parents: torch.Tensor, reference_parents: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct parents of the queries, and whether each has a reference (on any
        rank when distributed: every rank then scores the same parents in the same order)."""
        group = self._process_group()
        if group is not None:
            query_parents = group.union(query_parents, "listing the query parents")
            reference_parents = group.union(reference_parents, "listing the reference parents")
        parents = torch.unique(query_parents)
        return parents, torch.isin(parents, reference_parents)


def _average_over_parents(per_parent: dict[Any, dict[str, Any]], level: int) -> dict[str, float]:
    """Mean of each metric over the parents where it is defined (not NaN, not missing)."""
    metrics = list(dict.fromkeys(m for scores in per_parent.values() for m in scores))
    if not metrics:
        warn_external(
            f"Level {level}: no parent label of the queries has references, so there is "
            "nothing to score."
        )
    averages: dict[str, float] = {}
    for metric in metrics:
        values = {parent: scores.get(metric) for parent, scores in per_parent.items()}
        for parent, value in values.items():
            if value is not None and not isinstance(value, numbers.Real):
                raise InvalidArgumentError(
                    f"WithSameParentLabelTester averages metrics over parent labels, so "
                    f"{metric!r} must be a number. Got {type(value).__name__} for parent "
                    f"{parent!r}; use an accuracy_calculator without return_per_class."
                )
        defined = [v for v in values.values() if v is not None and not math.isnan(v)]
        left_out = [parent for parent, v in values.items() if v is None or math.isnan(v)]
        if left_out:
            warn_external(
                f"{metric} at level {level}: parent labels {left_out} have only lone queries "
                "(no reference shares their labels) and are left out of the average."
            )
        averages[metric] = sum(defined) / len(defined) if defined else math.nan
    return averages
