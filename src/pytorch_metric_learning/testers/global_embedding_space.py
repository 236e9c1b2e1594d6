"""Score each query against every reference: nearest neighbours in the whole space."""

from __future__ import annotations

from typing import Any

import torch

from .base_tester import BaseTester

__all__ = ["GlobalEmbeddingSpaceTester"]


class GlobalEmbeddingSpaceTester(BaseTester):
    """The general tester: each query's neighbours are searched among all references.

    Dataset items are ``(data, label)``; any ``splits_to_eval`` works. Takes every option
    of :class:`BaseTester`.

    Example:
        >>> tester = GlobalEmbeddingSpaceTester(dataloader_num_workers=0, progress_bar=False)
        >>> accuracies = tester.test({"val": val_dataset}, epoch=1, trunk_model=trunk)
    """

    def score_level(
        self,
        query: torch.Tensor,
        query_labels: torch.Tensor,
        reference: torch.Tensor,
        reference_labels: torch.Tensor,
        level: int,
        ref_includes_query: bool,
    ) -> dict[str, Any]:
        """``accuracy_calculator.get_accuracy`` on the labels of ``level``."""
        return dict(
            self.accuracy_calculator.get_accuracy(
                query=query,
                query_labels=query_labels[:, level],
                reference=reference,
                reference_labels=reference_labels[:, level],
                ref_includes_query=ref_includes_query,
            )
        )
