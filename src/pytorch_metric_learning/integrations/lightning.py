"""Evaluation inside a Lightning run: a callback around :class:`AccuracyAccumulator`.

The callback reads the embeddings that ``validation_step`` returns, accumulates them on
each rank, computes the metrics of the whole validation set at the epoch's end (sharded
across the ranks under DDP, padding removed) and logs them with ``LightningModule.log_dict``.
It needs the ``lightning`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from .._validation import invalid
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
        f"lightning is not installed. Install it with: {extra_install_hint('lightning')} "
        "(from a source checkout the command carries its constraints.txt, which pins torch "
        "and lightning to the tested versions; without it pip may replace torch).",
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

    At the start of each validation epoch the callback reads ``len(dataloader.dataset)``
    when the epoch reads that dataset whole, each row once (see :func:`whole_dataset_rows`):
    it then checks a given ``num_samples`` against it (``ValueError`` naming both when they
    differ) or, when none was given, uses it as ``num_samples``, so that neither
    ``indices`` nor ``num_samples`` is needed under DDP with Lightning's
    ``DistributedSampler``. Otherwise (a loop cut short by ``limit_val_batches``, a
    ``drop_last`` loader, another sampler) the given ``num_samples`` applies as it is.

    Args:
        prefix: Put before every logged name (``"val_precision_at_1"``); a ``str``
            (anything else raises ``TypeError`` naming ``prefix``).
        num_samples: The validation dataset's length; see :class:`AccuracyAccumulator`.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective under DDP.
        **calculator_options: :class:`AccuracyCalculator`'s arguments.

    Per-class results (``return_per_class=True``) are logged one value per class, keyed by
    the class's label: ``f"{prefix}{name}/{label}"`` (``val_precision_at_1/7``; a label
    row's values joined by ``_``), for each label with two rows or more (see
    :attr:`AccuracyAccumulator.last_class_labels`). One validation dataloader only: a batch
    from a second one raises ``ValueError`` (its rows and indices would mix with the first
    set's).
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
        if not isinstance(prefix, str):
            raise invalid("prefix", _OWNER, "a str", type(prefix).__name__, InvalidTypeError)
        self.prefix = prefix
        self.accumulator = AccuracyAccumulator(
            num_samples=num_samples, group=group, timeout=timeout, **calculator_options
        )
        self.num_samples = self.accumulator.num_samples
        self.last_accuracies: dict[str, MetricValue] = {}

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.accumulator.reset()
        rows = whole_dataset_rows(trainer)
        if rows is not None and self.num_samples is not None and rows != self.num_samples:
            raise invalid(
                "num_samples", _OWNER,
                f"the validation dataset's length, len(dataloader.dataset) = {rows}",
                self.num_samples,
            )  # fmt: skip
        self.accumulator.num_samples = self.num_samples if rows is None else rows

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
        classes = self.accumulator.last_class_labels
        self.accumulator.reset()
        pl_module.log_dict(loggable(self.last_accuracies, self.prefix, classes), sync_dist=False)


def whole_dataset_rows(trainer: Trainer) -> int | None:
    """``len(dataloader.dataset)`` when this validation epoch reads that whole dataset, each
    row once (before a DistributedSampler's padding), else ``None``.

    Whole means: one validation dataloader, not cut short by ``limit_val_batches``, with
    ``drop_last=False``, whose sampler is a plain ``SequentialSampler``, a ``RandomSampler``
    without replacement over every row, or a ``DistributedSampler`` over the loader's
    dataset with ``drop_last=False``. Any other sampler may read a part of the dataset, or
    rows twice, so its length says nothing about the rows that arrive.
    """
    try:
        loader = trainer.val_dataloaders
        batches = trainer.num_val_batches
    except Exception:  # no loader attached yet (a hand-driven loop): nothing to read
        return None
    if not isinstance(loader, DataLoader) or len(batches) != 1 or loader.drop_last:
        return None
    try:
        rows, full = len(loader.dataset), len(loader)  # type: ignore[arg-type]
    except TypeError:  # an iterable dataset has no length
        return None
    if batches[0] != full or not _reads_every_row_once(loader.sampler, loader.dataset, rows):
        return None
    return rows


def _reads_every_row_once(sampler: Any, dataset: Any, rows: int) -> bool:
    kind = type(sampler)
    if kind is SequentialSampler:
        return True
    if kind is RandomSampler:
        return not sampler.replacement and sampler.num_samples == rows
    if kind is DistributedSampler:
        return sampler.dataset is dataset and not sampler.drop_last
    return False


def loggable(
    accuracies: Mapping[str, MetricValue], prefix: str, class_labels: Sequence[Any] = ()
) -> dict[str, float]:
    """Flat ``{prefix + name: float}``; a per-class list gives one entry per class, keyed
    by the class's label (``class_labels``, in the list's order; a label row's values are
    joined with ``_``).

    Example:
        >>> loggable({"precision_at_1": 0.5, "r_precision": [1.0, 0.25]}, "val_", [3, 7])
        {'val_precision_at_1': 0.5, 'val_r_precision/3': 1.0, 'val_r_precision/7': 0.25}
    """
    flat: dict[str, float] = {}
    for name, value in accuracies.items():
        if not isinstance(value, list):
            flat[f"{prefix}{name}"] = float(value)
            continue
        if len(value) != len(class_labels):
            raise InvalidArgumentError(
                f"{_OWNER} got {len(value)} per-class values of {name!r} for "
                f"{len(class_labels)} labels with two or more rows; it cannot tell which "
                "value is which label's (a label_comparison_fn that groups labels?)."
            )
        flat.update({f"{prefix}{name}/{_key(c)}": float(v) for c, v in zip(class_labels, value)})
    return flat


def _key(label: Any) -> str:
    return "_".join(map(str, label)) if isinstance(label, list) else str(label)
