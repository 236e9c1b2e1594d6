"""Score each query against every reference: nearest neighbours in the whole space."""

from __future__ import annotations

from typing import Any

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

    def score_level(self, pair: ScoredPair, level: int) -> dict[str, Any]:
        """``accuracy_calculator.get_accuracy`` on the labels of ``level``."""
        return dict(self.accuracy_calculator.get_accuracy(**pair.accuracy_arguments(level)))
