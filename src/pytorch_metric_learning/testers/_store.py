"""One preallocated tensor per split, filled batch by batch.

Collecting a list of batch outputs and concatenating them holds every embedding twice at
the end; writing each batch into its rows of one tensor holds it once.
"""

from __future__ import annotations

import torch

from ..errors import InvalidArgumentError

__all__ = ["EmbeddingStore"]


class EmbeddingStore:
    """Rows for ``num_items`` items of ``num_streams`` embeddings each, and their labels.

    Stream ``s`` of item ``i`` is row ``s * num_items + i``: one stream is the usual
    layout, two streams put every anchor before every positive.
    """

    def __init__(
        self,
        num_items: int,
        num_streams: int,
        first_output: torch.Tensor,
        first_labels: torch.Tensor,
        device: torch.device,
    ) -> None:
        self.num_items = num_items
        self.filled = 0
        self.embeddings = torch.empty(
            (num_streams * num_items, first_output.shape[1]),
            dtype=first_output.dtype,
            device=device,
        )
        self.labels = torch.empty(
            (num_items, first_labels.shape[1]), dtype=first_labels.dtype, device=device
        )

    def write(self, outputs: list[torch.Tensor], labels: torch.Tensor, split_name: str) -> None:
        """Copy one batch (one output per stream) into the next rows."""
        start, stop = self.filled, self.filled + len(labels)
        if stop > self.num_items:
            raise InvalidArgumentError(
                f"Split {split_name!r} yielded more items than its len() of {self.num_items}; "
                "a dataset's __len__ must count every item its DataLoader yields."
            )
        if labels.shape[1] != self.labels.shape[1]:
            raise InvalidArgumentError(
                f"The labels of split {split_name!r} must have the same number of levels in "
                f"every batch. Got {labels.shape[1]} after {self.labels.shape[1]}."
            )
        for stream, output in enumerate(outputs):
            if output.shape[1] != self.embeddings.shape[1]:
                raise InvalidArgumentError(
                    f"The model's outputs for split {split_name!r} must have the same size in "
                    f"every batch. Got {output.shape[1]} after {self.embeddings.shape[1]}."
                )
            offset = stream * self.num_items
            self.embeddings[offset + start : offset + stop] = output
        self.labels[start:stop] = labels
        self.filled = stop

    def finish(self, split_name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled ``(embeddings, labels)``; every item must have been written."""
        if self.filled != self.num_items:
            raise InvalidArgumentError(
                f"Split {split_name!r} yielded {self.filled} items, but its len() is "
                f"{self.num_items}; a dataset's __len__ must count every item it yields."
            )
        return self.embeddings, self.labels
