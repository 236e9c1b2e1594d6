"""Train with one metric loss on the embeddings, optionally on mined tuples."""

from __future__ import annotations

from typing import Any

from .base_trainer import BaseTrainer

__all__ = ["MetricLossOnly"]


class MetricLossOnly(BaseTrainer):
    """Embed each batch and apply ``loss_funcs["metric_loss"](embeddings, labels, indices_tuple)``.

    ``indices_tuple`` is what ``mining_funcs["tuple_miner"](embeddings, labels)`` returns, or
    None without a miner. Any callable of that shape is a loss; this library ships none.
    The arguments are those of :class:`~pytorch_metric_learning.trainers.BaseTrainer`.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> def spread(embeddings, labels, indices_tuple):  # a toy loss
        ...     return -torch.pdist(embeddings).mean()
        >>> trunk = torch.nn.Linear(4, 2)
        >>> trainer = MetricLossOnly(
        ...     models={"trunk": trunk},
        ...     optimizers={"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)},
        ...     batch_size=4,
        ...     loss_funcs={"metric_loss": spread},
        ...     mining_funcs={},
        ...     dataset=TensorDataset(torch.randn(8, 4), torch.arange(8) % 2),
        ...     dataloader_num_workers=0,
        ... )
        >>> trainer.train(num_epochs=2)
        >>> trainer.epoch, trainer.get_global_iteration(), sorted(trainer.losses)
        (2, 3, ['metric_loss', 'total_loss'])
    """

    required_loss_funcs: tuple[str, ...] = ("metric_loss",)

    def calculate_loss(self, curr_batch: tuple[Any, Any]) -> dict[str, Any]:
        """The metric loss of one batch."""
        data, labels = curr_batch
        embeddings = self.compute_embeddings(data)
        indices_tuple = self.maybe_mine_embeddings(embeddings, labels)
        return {"metric_loss": self.loss_funcs["metric_loss"](embeddings, labels, indices_tuple)}
