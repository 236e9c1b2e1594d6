"""Evaluation inside a Lightning run: a callback around :class:`AccuracyAccumulator`.

The callback reads the embeddings that ``validation_step`` returns, accumulates them on
each rank, computes the metrics of the whole validation set at the epoch's end (sharded
across the ranks under DDP, padding removed) and logs them with ``LightningModule.log_dict``.
It needs the ``lightning`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError, PMLError
from ..evaluation.distributed.accumulator import AccuracyAccumulator
from ..evaluation.retrieval.accuracy_calculator import MetricValue
from ..evaluation.search._install_hint import extra_install_hint

logger = logging.getLogger(__name__)

__all__ = ["AccuracyCallback", "LightningNotInstalledError"]


class LightningNotInstalledError(PMLError, ModuleNotFoundError):
    """``lightning``, which this module needs, is not installed."""


try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ModuleNotFoundError as error:
    raise LightningNotInstalledError(
        "pytorch_metric_learning.integrations.lightning needs the 'lightning' extra, and "
        f"lightning is not installed. Install it with: {extra_install_hint('lightning')}",
        name="lightning",
    ) from error

_OWNER = "AccuracyCallback"


class AccuracyCallback(Callback):
    """Evaluate every validation epoch with :class:`AccuracyAccumulator` and log the metrics.

    ``validation_step`` returns a mapping with ``"embeddings"`` (``(batch, dims)``),
    ``"labels"`` and, optionally, ``"indices"`` (each row's index in the validation
    dataset). At the end of each validation epoch (not the sanity check) every rank computes
    the metrics of the whole validation set, each row counted once (see
    :class:`AccuracyAccumulator` for how DistributedSampler's padding is removed: pass
    ``indices``, or ``num_samples``), logs them as ``f"{prefix}{name}"`` through
    ``pl_module.log_dict(..., sync_dist=False)`` (the values are already those of all
    ranks, the same on every rank, so nothing is averaged again), and keeps them in
    :attr:`last_accuracies`.

    Args:
        prefix: Put before every logged name (``"val_precision_at_1"``).
        num_samples: The validation dataset's length; see :class:`AccuracyAccumulator`.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective under DDP.
        **calculator_options: :class:`AccuracyCalculator`'s arguments.

    Per-class results (``return_per_class=True``) are logged one value per class, as
    ``f"{prefix}{name}/{i}"``. One validation dataloader only: a batch from a second one
    raises ``ValueError`` (its rows and indices would mix with the first set's).
    """

    def __init__(
        self,
        *,
        prefix: str = "val_",
        num_samples: int | None = None,
        group: Any = None,
        timeout: float | timedelta | None = None,
        **calculator_options: Any,
    ) -> None:
        super().__init__()
        self.prefix = str(prefix)
        self.accumulator = AccuracyAccumulator(
            num_samples=num_samples, group=group, timeout=timeout, **calculator_options
        )
        self.last_accuracies: dict[str, MetricValue] = {}

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.accumulator.reset()

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if dataloader_idx != 0:
            raise InvalidArgumentError(
                f"{_OWNER} evaluates one validation set: the first validation dataloader. "
                f"Got a batch of dataloader {dataloader_idx} instead; give each set its own "
                "run of trainer.validate, or combine them into one dataset."
            )
        if not isinstance(outputs, Mapping) or not {"embeddings", "labels"} <= set(outputs):
            mapping = isinstance(outputs, Mapping)
            error = InvalidArgumentError if mapping else InvalidTypeError
            got = f"the keys {sorted(outputs)}" if mapping else type(outputs).__name__
            raise error(
                f"{_OWNER} needs validation_step to return a mapping with 'embeddings', "
                f"'labels' and optionally 'indices'. Got {got} instead."
            )
        self.accumulator.update(outputs["embeddings"], outputs["labels"], outputs.get("indices"))

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:  # a few batches only: the metrics would mean nothing
            self.accumulator.reset()
            return
        self.last_accuracies = self.accumulator.compute()
        self.accumulator.reset()
        pl_module.log_dict(loggable(self.last_accuracies, self.prefix), sync_dist=False)


def loggable(accuracies: Mapping[str, MetricValue], prefix: str) -> dict[str, float]:
    """Flat ``{prefix + name: float}``; a per-class list gives one entry per class.

    Example:
        >>> loggable({"precision_at_1": 0.5, "r_precision": [1.0, 0.25]}, "val_")
        {'val_precision_at_1': 0.5, 'val_r_precision/0': 1.0, 'val_r_precision/1': 0.25}
    """
    flat: dict[str, float] = {}
    for name, value in accuracies.items():
        if isinstance(value, list):
            flat.update({f"{prefix}{name}/{i}": float(v) for i, v in enumerate(value)})
        else:
            flat[f"{prefix}{name}"] = float(value)
    return flat
