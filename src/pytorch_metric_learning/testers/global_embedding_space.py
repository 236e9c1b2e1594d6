"""Score each query against every reference: nearest neighbours in the whole space."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidArgumentError
from ._scored_pair import ScoredPair
from .base_tester import BaseTester

__all__ = ["GlobalEmbeddingSpaceTester"]


class GlobalEmbeddingSpaceTester(BaseTester):
    """The general tester: each query's neighbours are searched among all references.

    Dataset items are ``(data, label)``; any ``splits_to_eval`` works. Takes every option
    of :class:`BaseTester`.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> generator = torch.Generator().manual_seed(0)
        >>> labels = torch.arange(40) % 4
        >>> data = torch.eye(4)[labels] + 0.1 * torch.randn(40, 4, generator=generator)
        >>> splits = {"train": TensorDataset(data[:30], labels[:30]),
        ...           "test": TensorDataset(data[30:], labels[30:])}
        >>> tester = GlobalEmbeddingSpaceTester(
        ...     dataloader_num_workers=0, data_device="cpu", progress_bar=False)
        >>> accuracies = tester.test(
        ...     splits, epoch=1, trunk_model=torch.nn.Identity(),
        ...     splits_to_eval=[("test", ["train"])])
        >>> sorted(accuracies["test"])  # doctest: +NORMALIZE_WHITESPACE
        ['AMI_level0', 'NMI_level0', 'epoch', 'mean_average_precision_at_r_level0',
         'precision_at_1_level0', 'r_precision_level0']
        >>> accuracies["test"]["precision_at_1_level0"]
        1.0
    """

    #: A label column holding each sample's category (e.g. Stanford Online Products'
    #: super-category), or None. When set, every metric is also recorded per category of
    #: the queries, under ``<metric>_category<c>_level<L>``, each computed on that
    #: category's queries alone against the same reference; ``<c>`` is the category after
    #: the tester's label mapping (``set_min_label_to_zero`` renumbers it). An attribute, not a
    #: constructor option: the constructor's signature is the spec's (2.x's) table.
    category_level: int | None = None

    def score_level(self, pair: ScoredPair, level: int) -> dict[str, Any]:
        """``accuracy_calculator.get_accuracy`` on the labels of ``level`` (and per
        category, with ``category_level``)."""
        arguments = pair.accuracy_arguments(level)
        if self.category_level is None:
            return dict(self.accuracy_calculator.get_accuracy(**arguments))
        categories = self._categories(pair)
        scores = dict(
            self.accuracy_calculator.get_accuracy(**arguments, query_categories=categories)
        )
        per_category = scores.pop("per_category")
        for category, values in per_category.items():
            scores.update({f"{name}_category{category}": v for name, v in values.items()})
        return scores

    def _categories(self, pair: ScoredPair) -> torch.Tensor:
        level, owner = self.category_level, type(self).__name__
        columns = pair.query_labels.shape[1]
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < columns:
            raise InvalidArgumentError(
                f"The 'category_level' attribute of {owner} must be None or a label column "
                f"(0 to {columns - 1}). Got {level!r} instead."
            )
        if self.distributed:
            raise InvalidArgumentError(
                f"The 'category_level' attribute of {owner} is not supported with "
                "distributed=True; set it to None."
            )
        return pair.query_labels[:, level]
