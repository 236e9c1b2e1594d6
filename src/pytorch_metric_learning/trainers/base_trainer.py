"""The training loop shared by every trainer: batches, losses, optimizer steps, hooks."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .._validation import check_positive_int, invalid
from ..errors import InvalidArgumentError, InvalidKeysError, InvalidTypeError
from ..testers.label_mapper import LabelMapper
from . import _freezing
from ._positional import NOT_GIVEN, miners_and_dataset

__all__ = ["BaseTrainer"]

logger = logging.getLogger(__name__)

Hook = Callable[[Any], Any]
_SCHEDULER_KINDS = ("_by_iteration", "_by_epoch", "_by_plateau")


def _default_data_and_label_getter(batch: Any) -> tuple[Any, Any]:
    return batch[0], batch[1]


def _check_mapping(value: Any, param: str, owner: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid(param, owner, "a dict", type(value).__name__, InvalidTypeError)
    return dict(value)


def _check_keys(
    mapping: Mapping[str, Any], param: str, owner: str, allowed: tuple[str, ...]
) -> None:
    unknown = [key for key in mapping if key not in allowed]
    if unknown:
        raise invalid(
            param, owner, f"a dict with keys among {list(allowed)}", unknown, InvalidKeysError
        )


def _check_prefixed_keys(
    mapping: Mapping[str, Any], param: str, owner: str, allowed: tuple[str, ...]
) -> None:
    """2.x's rule: each key must start with an allowed name (2.x matched them as regexes)."""
    unknown = [key for key in mapping if not str(key).startswith(allowed)]
    if unknown:
        raise invalid(
            param,
            owner,
            f"a dict whose keys start with one of {list(allowed)}",
            unknown,
            InvalidKeysError,
        )


def _first_parameter_device(model: Any) -> torch.device:
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")


def _to_device(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is not None and value.is_floating_point():
        return value.to(device=device, dtype=dtype)
    return value.to(device=device)


def _as_float(loss: Any) -> float:
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)


class BaseTrainer:
    """Train models with loss functions over a dataset, calling hooks as it goes.

    Subclasses say how a batch becomes losses in :meth:`calculate_loss`; the loop, the
    optimizer steps, learning-rate schedulers and hooks are shared.

    Args:
        models: ``{"trunk": ..., "embedder": ...}``; a missing embedder is the identity.
        optimizers: e.g. ``{"trunk_optimizer": ..., "embedder_optimizer": ...}``; every
            optimizer steps after each backward pass.
        batch_size: samples per batch (incomplete last batches are dropped).
        loss_funcs: the losses by name (which names: see the subclass).
        mining_funcs: the miners by name (which names: see the subclass); None (the
            default) for none.
        dataset: a map-style dataset whose items are ``(data, labels)`` (or see
            ``data_and_label_getter``). Positionally, ``mining_funcs, dataset`` and 2.x's
            ``dataset, mining_funcs`` both work after ``loss_funcs``; the rest is by keyword.
        sampler: a ``torch.utils.data.Sampler``; None shuffles.
        collate_fn: passed to the ``DataLoader``.
        dataloader_num_workers: ``DataLoader`` worker processes.
        data_device: where batches go; None: the device of the trunk's parameters.
        dtype: floating-point data is cast to it (e.g. ``torch.float16``).
        end_of_iteration_hook: called with the trainer after each iteration.
        end_of_epoch_hook: called with the trainer after each epoch; returning False stops.
        iterations_per_epoch: None: one pass over the data loader per epoch.
        loss_weights: a weight per loss name (default 1); the total loss is the weighted sum.
        lr_schedulers: schedulers keyed ``<anything>_by_iteration``, ``..._by_epoch`` or
            ``..._by_plateau`` (the last are stepped with the validation accuracy by
            :meth:`step_lr_plateau_schedulers`, which the hook container calls).
        gradient_clippers: callables (no arguments) run after backward, before stepping.
        label_hierarchy_level: which column of 2-D labels to train on.
        data_and_label_getter: splits a batch into ``(data, labels)``.
        freeze_these: names of models or losses to freeze (as in 2.x): their parameters get
            no gradients, they stay in eval mode, and their ``<name>_optimizer`` does not step.
        freeze_trunk_batchnorm: keep the trunk's batch-norm layers in eval mode, so their
            running statistics stay as they are (their weights still learn).
        dataset_labels: every label of the dataset (``(N,)`` or ``(N, levels)``), needed by
            ``set_min_label_to_zero``.
        set_min_label_to_zero: map each batch's labels to their rank among the unique
            ``dataset_labels`` of the trained hierarchy level, so they run from 0 to
            ``num_classes - 1`` (what a classification loss needs).
    """

    required_loss_funcs: tuple[str, ...] = ()
    # 2.x's key schema: the names of models and losses, from which the optimizer
    # ("<name>_optimizer") and gradient-clipper ("<name>_grad_clipper") keys are made.
    allowed_models: tuple[str, ...] = ("trunk", "embedder")
    allowed_loss_funcs: tuple[str, ...] = ("metric_loss",)
    allowed_mining_funcs: tuple[str, ...] = ("subset_batch_miner", "tuple_miner")

    def __init__(
        self,
        models: Mapping[str, Any],
        optimizers: Mapping[str, Any],
        batch_size: int,
        loss_funcs: Mapping[str, Callable[..., Any]],
        *miners_or_dataset: Any,
        mining_funcs: Mapping[str, Callable[..., Any]] | None = NOT_GIVEN,
        dataset: Dataset[Any] = NOT_GIVEN,
        sampler: Sampler[Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        dataloader_num_workers: int = 2,
        data_device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        end_of_iteration_hook: Hook | None = None,
        end_of_epoch_hook: Hook | None = None,
        iterations_per_epoch: int | None = None,
        loss_weights: Mapping[str, float] | None = None,
        lr_schedulers: Mapping[str, Any] | None = None,
        gradient_clippers: Mapping[str, Callable[[], Any]] | None = None,
        label_hierarchy_level: int = 0,
        data_and_label_getter: Callable[[Any], tuple[Any, Any]] | None = None,
        freeze_these: tuple[str, ...] | list[str] = (),
        freeze_trunk_batchnorm: bool = False,
        dataset_labels: Any = None,
        set_min_label_to_zero: bool = False,
    ) -> None:
        owner = type(self).__name__
        mining_funcs, dataset = miners_and_dataset(miners_or_dataset, mining_funcs, dataset, owner)
        self.models = self._check_models(models, owner)
        _check_prefixed_keys(self.models, "models", owner, self.allowed_models)
        self.optimizers = _check_mapping(optimizers, "optimizers", owner)
        _check_prefixed_keys(self.optimizers, "optimizers", owner, self._suffixed("_optimizer"))
        self.batch_size = check_positive_int(batch_size, "batch_size", owner)
        self.loss_funcs = self._check_loss_funcs(loss_funcs, owner)
        self.mining_funcs = _check_mapping(mining_funcs, "mining_funcs", owner)
        _check_keys(self.mining_funcs, "mining_funcs", owner, self.allowed_mining_funcs)
        self.dataset = dataset
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.dataloader_num_workers = self._check_workers(dataloader_num_workers, owner)
        self.data_device = torch.device(data_device) if data_device is not None else None
        self.dtype = dtype
        self.end_of_iteration_hook = end_of_iteration_hook
        self.end_of_epoch_hook = end_of_epoch_hook
        self._requested_iterations = (
            None
            if iterations_per_epoch is None
            else check_positive_int(iterations_per_epoch, "iterations_per_epoch", owner)
        )
        self.loss_weights = self._check_loss_weights(loss_weights, owner)
        self.lr_schedulers = self._check_schedulers(lr_schedulers, owner)
        self.gradient_clippers = _check_mapping(gradient_clippers, "gradient_clippers", owner)
        _check_prefixed_keys(
            self.gradient_clippers, "gradient_clippers", owner, self._suffixed("_grad_clipper")
        )
        self.label_hierarchy_level = self._check_level(label_hierarchy_level, owner)
        self.data_and_label_getter = data_and_label_getter or _default_data_and_label_getter
        self._check_freeze_options(freeze_these, freeze_trunk_batchnorm, owner)
        self.label_mapper = self._check_label_options(set_min_label_to_zero, dataset_labels, owner)
        self.set_min_label_to_zero = set_min_label_to_zero
        self.dataset_labels = dataset_labels
        self.epoch = 0
        self.iteration = 0
        self.iterations_per_epoch = 0
        self.losses: dict[str, float] = {}
        self._dataloader: DataLoader[Any] | None = None
        self._batches: Iterator[Any] | None = None

    # ------------------------------------------------------------------ checks
    def _suffixed(self, suffix: str) -> tuple[str, ...]:
        return tuple(name + suffix for name in self.allowed_models + self.allowed_loss_funcs)

    @staticmethod
    def _check_models(models: Any, owner: str) -> dict[str, Any]:
        models = _check_mapping(models, "models", owner)
        if not callable(models.get("trunk")):
            raise invalid(
                "models", owner, 'a dict with a callable "trunk"', list(models), InvalidKeysError
            )
        if models.get("embedder") is None:
            models.pop("embedder", None)
        return models

    def _check_loss_funcs(self, loss_funcs: Any, owner: str) -> dict[str, Any]:
        loss_funcs = _check_mapping(loss_funcs, "loss_funcs", owner)
        missing = [name for name in self.required_loss_funcs if name not in loss_funcs]
        if missing or not all(callable(f) for f in loss_funcs.values()):
            expected = f"a dict of callables with the keys {list(self.required_loss_funcs)}"
            error = InvalidKeysError if missing else InvalidArgumentError
            raise invalid("loss_funcs", owner, expected, list(loss_funcs), error)
        return loss_funcs

    def _check_loss_weights(self, loss_weights: Any, owner: str) -> dict[str, float]:
        weights = _check_mapping(loss_weights, "loss_weights", owner)
        _check_keys(weights, "loss_weights", owner, (*self.loss_funcs, "total_loss"))
        for name, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
                raise invalid(
                    "loss_weights", owner, "a dict of numbers", {name: weight}, InvalidTypeError
                )
        resolved = {name: float(weights.get(name, 1.0)) for name in self.loss_funcs}
        if loss_weights is None:
            resolved["total_loss"] = 1.0  # as 2.x's default weights (not used in the sum)
        return resolved

    @staticmethod
    def _check_schedulers(lr_schedulers: Any, owner: str) -> dict[str, Any]:
        schedulers = _check_mapping(lr_schedulers, "lr_schedulers", owner)
        wrong = [name for name in schedulers if not name.endswith(_SCHEDULER_KINDS)]
        if wrong:
            expected = f"a dict whose keys end with one of {list(_SCHEDULER_KINDS)}"
            raise invalid("lr_schedulers", owner, expected, wrong, InvalidKeysError)
        return schedulers

    @staticmethod
    def _check_workers(workers: Any, owner: str) -> int:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise invalid("dataloader_num_workers", owner, "an int >= 0", workers)
        return workers

    @staticmethod
    def _check_level(level: Any, owner: str) -> int:
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise invalid("label_hierarchy_level", owner, "an int >= 0", level)
        return level

    def _check_freeze_options(self, freeze_these: Any, freeze_batchnorm: Any, owner: str) -> None:
        allowed = {"trunk", "embedder", *self.models, *self.loss_funcs}
        self.freeze_these = _freezing.check_freeze_these(
            freeze_these, allowed, self.optimizers, owner
        )
        if not isinstance(freeze_batchnorm, bool):
            raise invalid(
                "freeze_trunk_batchnorm", owner, "a bool", freeze_batchnorm, InvalidTypeError
            )
        self.freeze_trunk_batchnorm = freeze_batchnorm

    @staticmethod
    def _check_label_options(set_min_label_to_zero: Any, dataset_labels: Any, owner: str) -> Any:
        if not isinstance(set_min_label_to_zero, bool):
            raise invalid(
                "set_min_label_to_zero", owner, "a bool", set_min_label_to_zero, InvalidTypeError
            )
        if set_min_label_to_zero and dataset_labels is None:
            raise invalid(
                "dataset_labels",
                owner,
                "every label of the dataset when set_min_label_to_zero is True",
                None,
            )
        return LabelMapper(set_min_label_to_zero, dataset_labels).map  # as 2.x: the map method

    # ------------------------------------------------------------------ the loop
    def train(self, start_epoch: int = 1, num_epochs: int = 1) -> None:
        """Run epochs ``start_epoch`` to ``num_epochs`` inclusive (2.x semantics).

        Stops early when ``end_of_epoch_hook`` returns False.

        Args:
            start_epoch: the first epoch to run (``load_latest_saved_models`` returns it).
            num_epochs: the last epoch to run.
        """
        start_epoch = check_positive_int(start_epoch, "start_epoch", "train")
        num_epochs = check_positive_int(num_epochs, "num_epochs", "train")
        self._start_data()
        try:
            for epoch in range(start_epoch, num_epochs + 1):
                self.epoch = epoch
                self._run_epoch()
                stop = self.end_of_epoch_hook is not None and self.end_of_epoch_hook(self) is False
                self.zero_losses()
                if stop:
                    logger.info("end_of_epoch_hook stopped training after epoch %d", self.epoch)
                    break
        finally:
            self._dataloader, self._batches = None, None

    def _run_epoch(self) -> None:
        self.set_to_train()
        logger.info("Training epoch %d", self.epoch)
        for iteration in range(self.iterations_per_epoch):
            self.iteration = iteration
            self.forward_and_backward()
            if self.end_of_iteration_hook is not None:
                self.end_of_iteration_hook(self)
            self._step_schedulers("_by_iteration")
        self._step_schedulers("_by_epoch")

    def forward_and_backward(self) -> None:
        """One iteration: a batch, its losses, backward, gradient clipping, optimizer steps."""
        self.zero_grad()
        data, labels = self._next_batch()
        losses = self.calculate_loss((data, labels))
        total: Any = 0.0
        for name, loss in losses.items():
            total = total + self.loss_weights.get(name, 1.0) * loss
        if isinstance(total, torch.Tensor) and total.requires_grad:
            total.backward()
            for clip in self.gradient_clippers.values():
                clip()
            for name, optimizer in self.optimizers.items():
                if not _freezing.is_frozen_optimizer(name, self.freeze_these):
                    optimizer.step()
        self.losses = {name: _as_float(loss) for name, loss in losses.items()}
        self.losses["total_loss"] = _as_float(total)

    def zero_losses(self) -> None:
        """Set every entry of ``losses`` to 0, as 2.x did after each epoch.

        Called after ``end_of_epoch_hook`` (2.x: before it), so that the hook still sees
        the epoch's last losses; after ``train()`` every loss reads 0, as in 2.x.
        """
        self.losses = dict.fromkeys(self.losses, 0.0)

    def calculate_loss(self, curr_batch: tuple[Any, Any]) -> dict[str, Any]:
        """Losses of one ``(data, labels)`` batch, by name (``loss_funcs`` keys)."""
        raise NotImplementedError(f"{type(self).__name__} must define calculate_loss")

    def compute_embeddings(self, data: Any) -> torch.Tensor:
        """``embedder(trunk(data))``; the trunk output when there is no embedder."""
        trunk_output = self.models["trunk"](data)
        embedder = self.models.get("embedder")
        return embedder(trunk_output) if embedder is not None else trunk_output

    def maybe_mine_embeddings(self, embeddings: torch.Tensor, labels: torch.Tensor) -> Any:
        """The ``tuple_miner``'s output, or None without one."""
        miner = self.mining_funcs.get("tuple_miner")
        return miner(embeddings, labels) if miner is not None else None

    def get_global_iteration(self) -> int:
        """Iterations done before the current one, counted from the start of epoch 1."""
        return self.iteration + self.iterations_per_epoch * (self.epoch - 1)

    def set_to_train(self) -> None:
        """Put models and losses in training mode (a tester leaves them in eval mode).

        Frozen ones (``freeze_these``) stay in eval mode without gradients; with
        ``freeze_trunk_batchnorm`` the trunk's batch-norm layers stay in eval mode.
        """
        for objects in (self.models, self.loss_funcs):
            _freezing.set_train_modes(objects, self.freeze_these)
        if self.freeze_trunk_batchnorm:
            _freezing.freeze_batchnorm(self.models["trunk"])

    def zero_grad(self) -> None:
        """Clear gradients of every model and optimizer."""
        for model in self.models.values():
            if hasattr(model, "zero_grad"):
                model.zero_grad()
        for optimizer in self.optimizers.values():
            optimizer.zero_grad()

    def step_lr_plateau_schedulers(self, validation_info: float) -> None:
        """Step the ``..._by_plateau`` schedulers with a validation accuracy."""
        for name, scheduler in self.lr_schedulers.items():
            if name.endswith("_by_plateau"):
                scheduler.step(validation_info)

    def _step_schedulers(self, kind: str) -> None:
        for name, scheduler in self.lr_schedulers.items():
            if name.endswith(kind):
                scheduler.step()

    # ------------------------------------------------------------------ data
    def _start_data(self) -> None:
        workers = self.dataloader_num_workers
        self._dataloader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=self.sampler,
            shuffle=self.sampler is None,
            drop_last=True,
            num_workers=workers,
            collate_fn=self.collate_fn,
            persistent_workers=workers > 0,
        )
        self.iterations_per_epoch = self._requested_iterations or len(self._dataloader)
        if self.iterations_per_epoch == 0:
            raise InvalidArgumentError(
                f"The dataset of {type(self).__name__} has no full batch of {self.batch_size} "
                "samples (incomplete batches are dropped); use a smaller batch_size."
            )
        self._batches = iter(self._dataloader)

    def _next_batch(self) -> tuple[Any, Any]:
        assert self._dataloader is not None and self._batches is not None  # set by train()
        try:
            batch = next(self._batches)
        except StopIteration:
            self._batches = iter(self._dataloader)
            batch = next(self._batches)
        data, labels = self.data_and_label_getter(batch)
        device = self.data_device or _first_parameter_device(self.models["trunk"])
        if isinstance(labels, torch.Tensor) and labels.ndim == 2:
            labels = labels[:, self.label_hierarchy_level]
        if self.set_min_label_to_zero:
            labels = self.label_mapper(labels, self.label_hierarchy_level)
        data, labels = _to_device(data, device, self.dtype), _to_device(labels, device, None)
        return self.maybe_do_batch_mining(data, labels)

    def maybe_do_batch_mining(self, data: Any, labels: Any) -> tuple[Any, Any]:
        """Keep the rows the ``subset_batch_miner`` picks, as 2.x did.

        The miner gets the batch's embeddings (computed without gradients, with the
        models in eval mode) and its labels, and returns the indices of the rows to keep.
        Without that miner the batch is returned as it is.
        """
        miner = self.mining_funcs.get("subset_batch_miner")
        if miner is None:
            return data, labels
        for model in self.models.values():
            if hasattr(model, "eval"):
                model.eval()
        with torch.no_grad():
            indices = miner(self.compute_embeddings(data), labels)
        self.set_to_train()
        return data[indices], labels[indices]
