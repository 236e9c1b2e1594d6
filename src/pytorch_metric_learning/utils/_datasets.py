"""A dataset of precomputed embeddings and the evaluation data loader, as in 2.x.

Re-exported by :mod:`pytorch_metric_learning.utils.common_functions`: 2.x tests and
examples build testers on ``EmbeddingDataset(embeddings, labels)``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["EmbeddingDataset", "get_eval_dataloader"]


class EmbeddingDataset(torch.utils.data.Dataset):
    """Pairs ``(embeddings[i], labels[i])``: a dataset whose "model input" is the embedding.

    With an identity trunk, a tester scores these embeddings as they are.

    Args:
        embeddings: Anything indexable by row (a tensor or an array).
        labels: One label (or label row) per embedding.

    Example:
        >>> dataset = EmbeddingDataset(torch.eye(3), torch.tensor([0, 1, 1]))
        >>> len(dataset), dataset[2]
        (3, (tensor([0., 0., 1.]), tensor(1)))
    """

    def __init__(self, embeddings: Any, labels: Any) -> None:
        self.embeddings = embeddings
        self.labels = labels

    def __len__(self) -> int:
        return len(self.embeddings)

    def __getitem__(self, idx: Any) -> tuple[Any, Any]:
        return self.embeddings[idx], self.labels[idx]


def get_eval_dataloader(
    dataset: Any, batch_size: int, num_workers: int, collate_fn: Callable[..., Any] | None
) -> torch.utils.data.DataLoader:
    """A loader over ``dataset`` in order, keeping the last partial batch.

    Example:
        >>> loader = get_eval_dataloader(EmbeddingDataset(torch.eye(3), torch.arange(3)), 2, 0, None)
        >>> [len(labels) for _, labels in loader]
        [2, 1]
    """
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=int(batch_size),
        drop_last=False,
        num_workers=num_workers,
        collate_fn=collate_fn,
        shuffle=False,
        pin_memory=False,
    )
