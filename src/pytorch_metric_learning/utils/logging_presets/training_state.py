"""What the hooks read from a training loop, for loops written without a trainer class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrainingState"]


@dataclass
class TrainingState:
    """The attributes :class:`HookContainer` reads, for a hand-written training loop.

    A trainer from :mod:`pytorch_metric_learning.trainers` has the same attributes, so the
    same hooks serve both. Update ``epoch``, ``global_iteration`` and ``losses`` as the loop
    runs.

    Attributes:
        models: ``{"trunk": ..., "embedder": ...}`` (the embedder is optional).
        optimizers: e.g. ``{"trunk_optimizer": ...}``; saved with the models.
        lr_schedulers, loss_funcs, mining_funcs: also saved when they have a state dict.
        epoch: the current epoch, starting at 1.
        global_iteration: iterations done since the start of training, starting at 0.
        losses: the latest loss values by name, recorded by ``end_of_iteration_hook``.

    Example:
        >>> import torch
        >>> state = TrainingState(models={"trunk": torch.nn.Linear(4, 2)})
        >>> state.losses = {"metric_loss": 0.3}
        >>> state.get_global_iteration()
        0
    """

    models: dict[str, Any]
    optimizers: dict[str, Any] = field(default_factory=dict)
    lr_schedulers: dict[str, Any] = field(default_factory=dict)
    loss_funcs: dict[str, Any] = field(default_factory=dict)
    mining_funcs: dict[str, Any] = field(default_factory=dict)
    epoch: int = 1
    global_iteration: int = 0
    losses: dict[str, float] = field(default_factory=dict)

    def get_global_iteration(self) -> int:
        """Iterations done since the start of training (what trainers also report)."""
        return self.global_iteration
