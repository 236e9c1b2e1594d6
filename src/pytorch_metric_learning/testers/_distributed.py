"""What a tester does differently when the ranks of a process group share the data.

Every rank passes the whole dataset; each embeds its share and keeps only its own rows,
so that the ranks' rows, concatenated in rank order, are each split exactly once and in
the dataset's order. The metrics then come from a DistributedAccuracyCalculator, and the
few other steps that need every rank's rows (the PCA fit, the parents of the same-parent
tester, the visualizer, ``get_all_embeddings``) go through this module's collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ..evaluation.distributed._collectives import (
    Comm,
    agree,
    all_gather_ints,
    all_gather_rows,
    all_reduce_sum,
    broadcast,
    resolve_comm,
)
from ..evaluation.distributed._labels import global_label_counts

__all__ = ["TesterGroup", "shard_indices"]

Split = tuple[torch.Tensor, torch.Tensor]


def shard_indices(num_items: int, rank: int, world_size: int) -> tuple[list[int], int]:
    """The dataset items rank ``rank`` embeds, and how many of them are its own.

    As with ``DistributedSampler(shuffle=False)``, every rank embeds
    ``ceil(num_items / world_size)`` items, so every rank runs the same number of batches,
    and rank ``r`` owns ``num_items // world_size`` items plus one if
    ``r < num_items % world_size``; the rest of its items are padding (repeats of the first
    items), embedded and then dropped. Unlike the sampler, each rank owns one contiguous
    block, so the ranks' own items in rank order are the dataset in its order.

    Example:
        >>> [shard_indices(5, rank, 3) for rank in range(3)]
        [([0, 1], 2), ([2, 3], 2), ([4, 0], 1)]
    """
    per_rank = -(-num_items // world_size)
    base, extra = divmod(num_items, world_size)
    own = base + int(rank < extra)
    start = rank * base + min(rank, extra)
    padding = [index % num_items for index in range(per_rank - own)]
    return list(range(start, start + own)) + padding, own


def drop_padding(embeddings: torch.Tensor, labels: torch.Tensor, own: int) -> Split:
    """Keep the first ``own`` items of every stream (``EmbeddingStore`` layout)."""
    if own == len(labels):
        return embeddings, labels
    streams = len(embeddings) // len(labels)
    rows = embeddings.reshape(streams, len(labels), embeddings.shape[1])[:, :own]
    return rows.reshape(streams * own, embeddings.shape[1]), labels[:own]


class TesterGroup:
    """The process group of a distributed tester during one call."""

    def __init__(self, group: Any, timeout: Any, device: torch.device) -> None:
        self.comm: Comm = resolve_comm(group, timeout, device)

    @property
    def rank(self) -> int:
        return self.comm.rank

    def embed_share(
        self, num_items: Callable[[], int], embed: Callable[[list[int]], Split], split_name: str
    ) -> Split:
        """Embed this rank's items of a split with ``embed(indices)``; keep its own rows.

        A rank whose step raises makes every rank raise at the same point.
        """
        error, length = None, 0
        try:
            length = num_items()
        except Exception as exc:
            error = exc
        stage = f"embedding split {split_name!r}"
        lengths = agree(self.comm, error, stage, [length])[:, 0].tolist()
        if len(set(lengths)) > 1:
            raise InvalidArgumentError(
                f"Split {split_name!r} must have the same length on every rank (each rank "
                f"passes the whole dataset and embeds its share). Got {lengths} (by rank)."
            )
        indices, own = shard_indices(length, self.rank, self.comm.world_size)
        error, out = None, None
        try:
            out = embed(indices)
        except Exception as exc:
            error = exc
        agree(self.comm, error, stage)
        assert out is not None
        return drop_padding(*out, own)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the ranks (for the PCA statistics)."""
        return all_reduce_sum(self.comm, tensor, "fitting the PCA")

    def from_rank0(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` on every rank."""
        return broadcast(self.comm, tensor, 0, "sharing the PCA components")

    def union(self, labels: torch.Tensor, stage: str) -> torch.Tensor:
        """The sorted distinct values of every rank's ``labels``."""
        return global_label_counts(self.comm, labels, stage)[0]

    def gather(self, embeddings: torch.Tensor, labels: torch.Tensor, stage: str) -> Split:
        """Every rank's rows of a split, in rank order, on every rank.

        ``embeddings`` may hold several streams (``EmbeddingStore`` layout); each stream
        is gathered on its own, so the result has the same layout for the whole split.
        """
        counts = all_gather_ints(self.comm, [len(labels), len(embeddings)], stage).tolist()
        label_counts = [count for count, _ in counts]
        rows = all_gather_rows(self.comm, embeddings, [rows for _, rows in counts], stage)
        every_label = all_gather_rows(self.comm, labels, label_counts, stage)
        streams = len(rows) // max(1, len(every_label))
        parts = [
            part.reshape(streams, count, rows.shape[1])
            for part, count in zip(torch.split(rows, [r for _, r in counts]), label_counts)
        ]
        by_stream = [torch.cat([part[stream] for part in parts]) for stream in range(streams)]
        device = embeddings.device
        return torch.cat(by_stream).to(device), every_label.to(labels.device)
