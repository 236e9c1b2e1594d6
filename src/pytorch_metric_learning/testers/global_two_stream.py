"""Score pair-trained models: anchors are the queries, their positives the references."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ._batches import unpack_batch
from .base_tester import EmbeddingsAndLabels
from .global_embedding_space import GlobalEmbeddingSpaceTester

__all__ = ["GlobalTwoStreamEmbeddingSpaceTester"]


class GlobalTwoStreamEmbeddingSpaceTester(GlobalEmbeddingSpaceTester):
    """For models trained on (anchor, positive) pairs, e.g. with a two-stream loss.

    Dataset items are ``(anchor, positive, label)`` (or ``data_and_label_getter`` returns
    that triple from a batch). Each split is evaluated against itself only: the anchors'
    embeddings are the query, the positives' embeddings the reference, and
    ``ref_includes_query`` is always False (they are different samples). Labels keep
    their integer dtype. ``tester.embeddings_and_labels[split]`` holds every anchor's
    embedding followed by every positive's, and one row of labels per pair.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
        >>> anchors = torch.eye(3)[[0, 1, 2, 0, 1, 2]]
        >>> pairs = TensorDataset(anchors, anchors + 0.1, torch.tensor([0, 1, 2, 0, 1, 2]))
        >>> tester = GlobalTwoStreamEmbeddingSpaceTester(
        ...     accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        ...     dataloader_num_workers=0, data_device="cpu", progress_bar=False)
        >>> dict(tester.test({"val": pairs}, 1, torch.nn.Identity()))
        {'val': {'epoch': 1, 'precision_at_1_level0': 1.0}}
    """

    def set_reference_and_query(
        self, embeddings_and_labels: EmbeddingsAndLabels, query_split_name: str,
        reference_split_names: Sequence[str],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Anchors of the split as the query, its positives as the reference."""
        self._check_same_split(query_split_name, reference_split_names)
        embeddings, labels = embeddings_and_labels[query_split_name]
        return embeddings[: len(labels)], labels, embeddings[len(labels) :], labels

    def ref_includes_query(
        self, query_split_name: str, reference_split_names: Sequence[str]
    ) -> bool:
        """Always False: the positives are not the anchors."""
        return False

    def _check_plan(self, plan: list[tuple[str, tuple[str, ...]]]) -> None:
        for query_split_name, reference_split_names in plan:
            self._check_same_split(query_split_name, reference_split_names)

    def _check_same_split(
        self, query_split_name: str, reference_split_names: Sequence[str]
    ) -> None:
        if list(reference_split_names) != [query_split_name]:
            raise InvalidArgumentError(
                f"{self._owner} evaluates each split against itself (anchors vs positives), so "
                f"splits_to_eval must pair every query split with [itself]. Got "
                f"({query_split_name!r}, {list(reference_split_names)!r}) instead; use the "
                "default splits_to_eval=None."
            )

    def _unpack(self, batch: Any, split_name: str) -> tuple[Any, ...]:
        layout = "(anchor, positive, label)"
        return unpack_batch(batch, self.data_and_label_getter, layout, split_name)

    def _pca_rows(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return embeddings[len(labels) :]
