"""Hooks that close the training loop: validate, record, keep the best model, stop early."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence, Set
from typing import Any, Callable, Union

import torch

from ..._validation import check_positive_int, invalid
from ...errors import InvalidArgumentError, InvalidTypeError, ResumeError
from ...evaluation.retrieval._calculator_checks import check_device
from ..checkpoints import (
    apply_checkpoints,
    checkpoint_path,
    delete_checkpoints,
    load_checkpoints,
    save_checkpoints,
    saved_epochs,
    saved_suffixes,
    unwrap_model,
)
from ..record_keeping import RecordKeeper
from ._hooks_2x import ITERATION_2X, HookContainer2xMethods, is_logged_iteration, running_best
from ._rank import is_main_process
from ._resume import (
    check_no_best_set,
    find_resume_point,
    set_aside_after,
    set_aside_everything,
)
from .metric_keys import is_better, numeric_accuracies, resolve_metric_key

__all__ = ["HookContainer"]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
Best = tuple[int, float]
_OWNER = "HookContainer"


def _map_location(device: Any, owner: str) -> Any:
    """``device`` for ``torch.load``: "cpu" for None; a device this machine lacks ("cuda"
    without CUDA, a typo) is refused here, not reported later as a damaged checkpoint."""
    if device is None:
        return "cpu"
    if isinstance(device, (str, int, torch.device)) and not isinstance(device, bool):
        return check_device(device, owner)
    return device  # a mapping or a function, as torch.load accepts


def _check_patience(patience: Any) -> int | None:
    if patience is None:
        return None
    if isinstance(patience, bool) or not isinstance(patience, int):
        raise invalid(
            "patience", "end_of_epoch_hook", "None or an int >= 0", patience, InvalidTypeError
        )
    if patience < 0:
        raise invalid("patience", "end_of_epoch_hook", "None or an int >= 0", patience)
    return patience


class HookContainer(HookContainer2xMethods):
    """Hooks for a trainer (or a hand-written loop) and a tester.

    * ``end_of_iteration_hook(trainer)`` records ``trainer.losses`` and learning rates
      every ``log_freq`` iterations of an epoch (``trainer.iteration % log_freq == 0``),
      as 2.x did.
    * ``end_of_testing_hook(tester)`` records ``tester.all_accuracies`` of every split and
      tracks the best epoch of each split.
    * ``end_of_epoch_hook(tester, dataset_dict, model_folder, ...)`` returns the hook a
      trainer calls after each epoch: every ``test_interval`` epochs it validates, saves
      ``<name>_<epoch>.pth`` (the latest) and, on a new best, ``<name>_best<epoch>.pth``,
      and it returns False once ``epoch - best_epoch > patience``.

    The best epoch of a split is the first epoch whose primary metric is strictly greater
    than every earlier one. The container tracks it itself (so a tester whose
    ``end_of_testing_hook`` is the user's own still works) and reads it back from the
    records after a restart.

    Under ``torch.distributed`` (every rank runs the same loop with the same hooks), only
    rank 0 records and saves: on the other ranks the hooks write no record, no checkpoint
    and delete nothing. Every rank still tracks the best epoch from ``all_accuracies``
    (the same on every rank with a tester built with ``distributed=True``), so every rank
    stops at the same epoch. The other ranks read records only to find the best epoch of
    earlier runs, after a restart: the record folder must then be shared.

    Args:
        record_keeper: where records go (see :func:`get_record_keeper`).
        record_group_name_prefix: prepended (with ``_``) to every record group name.
        primary_metric: the metric that picks the best epoch, e.g. ``"precision_at_1"``;
            matched against keys such as ``<metric>_level0``.
        validation_split_name: the split whose primary metric decides.
        save_models: whether ``end_of_epoch_hook`` writes checkpoints.
        log_freq: losses and learning rates are recorded (and written to disk) every
            ``log_freq`` iterations, as in 2.x; accuracies every test.

    Example:
        >>> import tempfile
        >>> from types import SimpleNamespace
        >>> from pytorch_metric_learning.utils.record_keeping import RecordKeeper
        >>> hooks = HookContainer(RecordKeeper(tempfile.mkdtemp()), primary_metric="precision_at_1")
        >>> hooks.get_best_epoch_and_accuracy(None, "val")
        (None, 0.0)
        >>> for epoch, value in [(1, 0.5), (2, 0.75), (3, 0.75)]:  # what a tester leaves
        ...     tester = SimpleNamespace(
        ...         all_accuracies={"val": {"epoch": epoch, "precision_at_1_level0": value}})
        ...     hooks.end_of_testing_hook(tester)
        >>> hooks.get_accuracy_history(tester, "val")
        {'epoch': [1, 2, 3], 'precision_at_1_level0': [0.5, 0.75, 0.75]}
        >>> hooks.get_best_epoch_and_accuracy(tester, "val")
        (2, 0.75)
    """

    saveable_trainer_objects = (
        "models",
        "optimizers",
        "lr_schedulers",
        "loss_funcs",
        "mining_funcs",
    )

    def __init__(
        self,
        record_keeper: RecordKeeper,
        record_group_name_prefix: str | None = None,
        primary_metric: str = "mean_average_precision_at_r",
        validation_split_name: str = "val",
        save_models: bool = True,
        log_freq: int = 50,
    ) -> None:
        for param, value in [
            ("primary_metric", primary_metric),
            ("validation_split_name", validation_split_name),
        ]:
            if not isinstance(value, str) or not value:
                raise invalid(param, _OWNER, "a non-empty str", value, InvalidTypeError)
        self.record_keeper = record_keeper
        self.record_group_name_prefix = record_group_name_prefix
        self.primary_metric = primary_metric
        self.validation_split_name = validation_split_name
        self.do_save_models = bool(save_models)
        self.log_freq = check_positive_int(log_freq, "log_freq", _OWNER)
        self._best: dict[str, Best | None] = {}
        self._testing_epoch: int | None = None
        self._recorded_by_hook = False
        # While an epoch is being saved: its accuracy records, committed after its checkpoints.
        self._deferred: list[tuple[dict[str, float], int, str]] | None = None

    # ------------------------------------------------------------------ record groups
    def record_group_name(self, name: str) -> str:
        """The record group ``name``, with the container's prefix."""
        prefix = self.record_group_name_prefix
        return f"{prefix}_{name}" if prefix else name

    def accuracy_group_name(self, split_name: str) -> str:
        """The record group holding the accuracies of one split, e.g. ``accuracies_val``."""
        return self.record_group_name(f"accuracies_{split_name}")

    # ------------------------------------------------------------------ hooks
    def end_of_iteration_hook(self, trainer: Any) -> None:
        """Record the latest losses and each optimizer's learning rate (on rank 0 only),
        every ``log_freq`` iterations of an epoch."""
        if not is_main_process() or not is_logged_iteration(trainer, self.log_freq):
            return
        step = int(trainer.get_global_iteration())
        group = self.record_group_name("loss_histories")
        self.record_keeper.update_records(trainer.losses, step, group, step_name="iteration")
        rates = {
            str(name): float(opt.param_groups[0]["lr"])
            for name, opt in dict(getattr(trainer, "optimizers", None) or {}).items()
            if getattr(opt, "param_groups", None)
        }
        if rates:
            group = self.record_group_name("learning_rates")
            self.record_keeper.update_records(rates, step, group, step_name="iteration")
        self.record_keeper.save_records()

    def end_of_testing_hook(self, tester: Any) -> None:
        """Record ``tester.all_accuracies`` (on rank 0 only) and update each split's best
        epoch (on every rank)."""
        self._record_accuracies(tester, self._epoch_of(tester))
        self._recorded_by_hook = True

    def end_of_epoch_hook(
        self,
        tester: Any,
        dataset_dict: Mapping[str, Any],
        model_folder: PathLike,
        test_interval: int = 1,
        patience: int | None = None,
        splits_to_eval: Sequence[tuple[str, Sequence[str]]] | None = None,
        test_collate_fn: Callable[..., Any] | None = None,
    ) -> Callable[[Any], bool]:
        """Build the hook a trainer calls after each epoch.

        Args:
            tester: e.g. a ``GlobalEmbeddingSpaceTester``.
            dataset_dict: the splits to test, which must include the validation split.
            model_folder: where checkpoints go.
            test_interval: validate (and save) when ``epoch % test_interval == 0``.
            patience: stop when ``epoch - best_epoch > patience``; None never stops.
            splits_to_eval: passed to ``tester.test``.
            test_collate_fn: passed to ``tester.test`` as ``collate_fn``.

        Returns:
            ``hook(trainer) -> bool``: False means "stop training".
        """
        test_interval = check_positive_int(test_interval, "test_interval", "end_of_epoch_hook")
        patience = _check_patience(patience)
        self._check_validation_setup(tester, dataset_dict, splits_to_eval)

        def hook(trainer: Any) -> bool:
            self.record_keeper.save_records()
            if trainer.epoch % test_interval != 0:
                return True
            test_args = (splits_to_eval, test_collate_fn)
            best_epoch = self._validate_and_save(
                trainer, tester, model_folder, dataset_dict, *test_args
            )
            return self.patience_remaining(trainer.epoch, best_epoch, patience)

        return hook

    # ------------------------------------------------------------------ queries
    def get_best_epoch_and_accuracy(
        self, tester: Any, split_name: str, ignore_epoch: Sequence[int] = (-1,)
    ) -> tuple[int | None, float]:
        """The best epoch of ``split_name`` and its primary metric; ``(None, 0.0)`` if none.

        ``tester`` is accepted for compatibility with 2.x; the records of a split do not
        depend on it. ``ignore_epoch`` (as in 2.x): epochs left out, e.g. ``(epoch,)`` for
        the best before ``epoch``; they are read from the records.
        """
        ignored = set(ignore_epoch) - {-1}
        best = (
            self._best_from_records(split_name, ignored) if ignored else self._best_for(split_name)
        )
        return best if best is not None else (None, 0.0)

    def get_accuracy_history(
        self,
        tester: Any,
        split_name: str,
        return_all_metrics: bool = False,
        metrics: Sequence[str] = (),
    ) -> dict[str, list[Any]]:
        """The recorded accuracies of a split: ``{"epoch": [...], <metric key>: [...]}``.

        Args:
            tester: accepted for compatibility with 2.x.
            split_name: e.g. ``"val"``.
            return_all_metrics: every recorded metric instead of ``metrics``.
            metrics: metric names (``"precision_at_1"``) or keys; default: the primary metric.

        Returns:
            One list per key, aligned with ``"epoch"``; ``{}`` before anything is recorded.
            With ``return_all_metrics``, also 2.x's ``best_epoch`` and ``best_accuracy``
            columns (the best so far after each epoch).

        Raises:
            InvalidArgumentError: a requested metric was never recorded for this split.
        """
        group = self.accuracy_group_name(split_name)
        recorded = self.record_keeper.names(group)
        if not recorded:
            return {}
        wanted = [metrics] if isinstance(metrics, str) else list(metrics or [self.primary_metric])
        keys = recorded if return_all_metrics else [self._recorded_key(m, recorded) for m in wanted]
        epochs, values = self.record_keeper.history(group, keys)
        history: dict[str, list[Any]] = {"epoch": list(epochs), **values}
        if return_all_metrics:
            history.update(running_best(self.primary_metric, history))
            history[ITERATION_2X] = list(epochs)  # 2.x recorded accuracies at iteration=epoch
        return history

    def get_loss_history(self, loss_names: Sequence[str] = ()) -> dict[str, list[Any]]:
        """Recorded losses by name; ``{}`` if none.

        As in 2.x: with ``loss_names``, exactly those columns (``"~iteration~"`` or
        ``"iteration"`` may be among them); without, every column: each loss,
        ``"iteration"`` and ``"~iteration~"`` (2.x's name for it, the same list).
        """
        group = self.record_group_name("loss_histories")
        recorded = self.record_keeper.names(group)
        if not recorded:
            return {}
        iteration_keys = ("iteration", ITERATION_2X)
        names = [loss_names] if isinstance(loss_names, str) else list(loss_names)
        for name in names:
            if name not in recorded and name not in iteration_keys:
                expected = f"names among {[*recorded, *iteration_keys]}"
                raise invalid("loss_names", "get_loss_history", expected, name)
        losses = [name for name in names if name not in iteration_keys] if names else recorded
        iterations, values = self.record_keeper.history(group, losses)
        every: dict[str, list[Any]] = {
            "iteration": list(iterations),
            ITERATION_2X: list(iterations),
            **values,
        }
        return {name: every[name] for name in names} if names else every

    @staticmethod
    def patience_remaining(epoch: int, best_epoch: int | None, patience: int | None) -> bool:
        """False once ``epoch - best_epoch > patience`` (never with ``patience=None``).

        Example:
            >>> HookContainer.patience_remaining(7, 5, 2), HookContainer.patience_remaining(8, 5, 2)
            (True, False)
        """
        if patience is not None and best_epoch is not None and epoch - best_epoch > patience:
            logger.info("Validation accuracy has plateaued since epoch %d. Stopping.", best_epoch)
            return False
        return True

    # ------------------------------------------------------------------ checkpoints
    def load_latest_saved_models(
        self,
        trainer: Any,
        model_folder: PathLike,
        device: Any = None,
        best: bool = False,
        *,
        start_fresh: bool = False,
    ) -> int:
        """Load the latest saved state into ``trainer``; return the epoch to start at.

        The state loaded is the newest checkpoint set that is complete, loads whole and
        whose epoch is in the validation records; a damaged newer set is skipped with a
        warning naming the bad file. Records of later epochs and checkpoint files of later
        epochs (left by a run that stopped before committing them) are set aside, not
        deleted: rows move to the ``superseded_records`` table, files to
        ``<model_folder>/superseded/``. So the best epoch and the patience counter are
        those of the saved state.

        Args:
            trainer: a trainer or :class:`TrainingState`; its objects are loaded in place.
            model_folder: where the checkpoints are.
            device: ``map_location`` for ``torch.load`` (default ``"cpu"``).
            best: load the best checkpoint instead (as 2.x's ``best=True``), through
                :meth:`load_best_saved_models`, and set nothing aside.
            start_fresh: set aside every checkpoint in ``model_folder`` (the files
                ``<name>_<epoch>.pth`` and ``<name>_best<epoch>.pth``) and every record of
                this container, and start at epoch 1.

        Returns:
            The saved epoch plus one (the best epoch plus one with ``best=True``); 1 when
            nothing was saved.

        Raises:
            InvalidArgumentError: ``device`` is not a device of this machine (``"cuda"``
                without CUDA, a misspelt name).
            ResumeError: the saved objects are not the trainer's (one missing or extra),
                or records exist but no loadable checkpoint set matches them (a typo in
                ``model_folder``, every set damaged). Nothing is loaded or changed.
        """
        if best:
            if start_fresh:
                raise invalid("best", "load_latest_saved_models", "False with start_fresh", best)
            return (self.load_best_saved_models(trainer, model_folder, device) or 0) + 1
        objects = self._saveable(trainer)
        device = _map_location(device, "HookContainer.load_latest_saved_models")
        if start_fresh:
            self._best.clear()
            if is_main_process():
                self.own_folders(model_folder)
                set_aside_everything(
                    self.record_keeper, self.owns_group, model_folder, list(objects)
                )
            return 1
        group = self.accuracy_group_name(self.validation_split_name)
        recorded = self.record_keeper.history(group, [])[0]
        point = find_resume_point(list(objects), model_folder, recorded, device)
        if is_main_process():
            self.own_folders(model_folder)
        if point.epoch:
            files = {name: checkpoint_path(model_folder, name, point.suffix) for name in objects}
            apply_checkpoints(objects, point.states, files)
        self._best.clear()
        if self.do_save_models and is_main_process():
            set_aside_after(
                self.record_keeper, self._owns_accuracies, point.epoch, list(objects), model_folder
            )
        logger.info("Resuming at epoch %d", point.epoch + 1)
        return point.epoch + 1

    def load_best_saved_models(
        self, trainer: Any, model_folder: PathLike, device: Any = None
    ) -> int | None:
        """Load the best checkpoint into ``trainer``; return its epoch (None if there is none).

        The best epoch is the one the records name (it must have a complete set); without
        records of it, the newest complete best set.

        Raises:
            InvalidArgumentError: ``device`` is not a device of this machine.
            ResumeError: the records name a best epoch that has no complete best set (a
                typo in ``model_folder``, a file removed, another run's folder), or no
                complete best set exists although some of the objects have best
                checkpoints (an object was added). Nothing is loaded.
            CorruptFileError: a file of the best set cannot be read (names the file).
        """
        objects = self._saveable(trainer)
        device = _map_location(device, "HookContainer.load_best_saved_models")
        epochs = saved_suffixes(model_folder, objects, tag="best")
        best = self._best_for(self.validation_split_name)
        recorded = best[0] if best and self.do_save_models else None
        if not epochs:
            check_no_best_set(list(objects), model_folder, recorded)
            return None
        if recorded is not None and recorded not in epochs:
            raise ResumeError(
                f"Cannot load the best model from the model folder {str(model_folder)!r}: "
                f"the records name epoch {recorded} best, but the folder has no complete "
                f"checkpoint set best{recorded} of the objects {list(objects)} (complete "
                f"best sets: {epochs}). Loading another epoch would not be the best model. "
                "Check the folder name and the objects given. Nothing was loaded."
            )
        epoch = recorded if recorded is not None else epochs[-1]
        load_checkpoints(objects, model_folder, f"best{epoch}", device)
        return epoch

    def save_models(
        self, trainer: Any, model_folder: PathLike, epoch: int, is_new_best: bool
    ) -> None:
        """Save the latest checkpoint (and the best one), then remove the ones they replace.

        Old files are removed only after every new file is in place, and each file is
        written atomically, so a crash at any point leaves a loadable best checkpoint.
        Under ``torch.distributed``, only rank 0 saves; the other ranks return at once.
        """
        if not is_main_process():
            return
        self.own_folders(model_folder)
        self._write_checkpoints(trainer, model_folder, epoch, is_new_best)
        self._prune_replaced(trainer, model_folder, epoch, is_new_best)

    def own_folders(self, model_folder: PathLike) -> None:
        """Lock the model folder and the record folder for this run (``fcntl.flock`` on
        ``.pml-run.lock``), held by the record keeper until its ``close()``; a second
        process gets :class:`~pytorch_metric_learning.errors.FolderInUseError` naming the
        folder and the PID of the process that holds it. A lock of a dead process never
        blocks (the kernel drops it)."""
        self.record_keeper.lock_folder()
        self.record_keeper.lock_folder(model_folder, "model folder")

    def owns_group(self, group: str) -> bool:
        """Whether the record group ``group`` is this container's: its exact prefix, then
        ``loss_histories``, ``learning_rates`` or ``accuracies_<split>``.

        Example:
            >>> from pytorch_metric_learning.utils.record_keeping import RecordKeeper
            >>> import tempfile
            >>> hooks = HookContainer(RecordKeeper(tempfile.mkdtemp()), "a")
            >>> hooks.owns_group("a_accuracies_val"), hooks.owns_group("a_b_accuracies_val")
            (True, False)
        """
        rest = self._without_prefix(group)
        return rest is not None and (
            rest in ("loss_histories", "learning_rates") or rest.startswith("accuracies_")
        )

    def _owns_accuracies(self, group: str) -> bool:
        rest = self._without_prefix(group)
        return rest is not None and rest.startswith("accuracies_")

    def _without_prefix(self, group: str) -> str | None:
        prefix = self.record_group_name("")
        return group[len(prefix) :] if group.startswith(prefix) else None

    def _write_checkpoints(
        self, trainer: Any, model_folder: PathLike, epoch: int, is_new_best: bool
    ) -> None:
        objects = self._saveable(trainer)
        if is_new_best:
            save_checkpoints(objects, model_folder, f"best{epoch}")
        save_checkpoints(objects, model_folder, epoch)

    def _prune_replaced(
        self, trainer: Any, model_folder: PathLike, epoch: int, is_new_best: bool
    ) -> None:
        objects = self._saveable(trainer)
        best = self._best_for(self.validation_split_name)
        best_epoch = epoch if is_new_best else (best[0] if best else None)
        best_is_saved = best_epoch in saved_suffixes(model_folder, objects, "best")
        # A best set is removed only when the records show it is worse under the current
        # primary metric: one saved under another metric (changed on resume) is kept.
        scored = self._scored_epochs(self.validation_split_name) if best_is_saved else set()
        for name in objects:
            self._prune(name, model_folder, "", lambda e: e != epoch)
            if best_is_saved:
                self._prune(name, model_folder, "best", lambda e: e != best_epoch and e in scored)

    def _scored_epochs(self, split_name: str) -> set[int]:
        """Epochs whose records hold a value of the primary metric."""
        group = self.accuracy_group_name(split_name)
        key = resolve_metric_key(self.primary_metric, self.record_keeper.names(group))
        if key is None:
            return set()
        epochs, values = self.record_keeper.history(group, [key])
        return {e for e, v in zip(epochs, values[key]) if v is not None and not math.isnan(v)}

    # ------------------------------------------------------------------ internals
    def _check_validation_setup(
        self, tester: Any, dataset_dict: Mapping[str, Any], splits_to_eval: Sequence[Any] | None
    ) -> None:
        val = self.validation_split_name
        if not isinstance(dataset_dict, Mapping) or val not in dataset_dict:
            got = list(dataset_dict) if isinstance(dataset_dict, Mapping) else dataset_dict
            raise invalid(
                "dataset_dict", "end_of_epoch_hook", f"a dict with the split {val!r}", got
            )
        if splits_to_eval is not None and val not in [query for query, _ in splits_to_eval]:
            raise invalid(
                "splits_to_eval",
                "end_of_epoch_hook",
                f"a list with {val!r} as a query split",
                splits_to_eval,
            )
        get_metrics = getattr(
            getattr(tester, "accuracy_calculator", None), "get_curr_metrics", None
        )
        if callable(get_metrics) and self.primary_metric not in get_metrics():
            expected = f"one of the tester's metrics {list(get_metrics())}"
            raise invalid("primary_metric", _OWNER, expected, self.primary_metric)

    def _validate_and_save(
        self,
        trainer: Any,
        tester: Any,
        model_folder: PathLike,
        dataset_dict: Mapping[str, Any],
        *test_args: Any,
    ) -> int | None:
        epoch = int(trainer.epoch)
        defer = self.do_save_models and is_main_process()
        self._deferred = [] if defer else None
        try:
            is_new_best = self._test_epoch(trainer, tester, epoch, dataset_dict, *test_args)
            if defer:
                self._save_and_commit(trainer, model_folder, epoch, is_new_best)
        except BaseException:
            self._best.clear()  # re-read from the records, which lack this epoch
            raise
        finally:
            self._deferred = None
        best = self._best_for(self.validation_split_name)
        if best is None:
            return None
        if is_new_best:
            logger.info("New best %s: %s at epoch %d", self.primary_metric, best[1], epoch)
        return best[0]

    def _test_epoch(
        self, trainer: Any, tester: Any, epoch: int, dataset_dict: Any, splits: Any, collate: Any
    ) -> bool:
        """Run the tester, step plateau schedulers; return whether ``epoch`` is a new best."""
        self._run_tester(tester, epoch, trainer.models, dataset_dict, splits, collate)
        if self.validation_split_name not in tester.all_accuracies:
            raise InvalidArgumentError(
                f"The tester returned no accuracies for the validation split "
                f"{self.validation_split_name!r} (got {list(tester.all_accuracies)}); "
                "check splits_to_eval and validation_split_name."
            )
        best = self._best_for(self.validation_split_name)
        step_plateau = getattr(trainer, "step_lr_plateau_schedulers", None)
        if callable(step_plateau):
            step_plateau(self._primary_value(tester.all_accuracies[self.validation_split_name]))
        return best is not None and best[0] == epoch

    def _save_and_commit(
        self, trainer: Any, model_folder: PathLike, epoch: int, is_new_best: bool
    ) -> None:
        """Checkpoints first, then the epoch's records (the commit), then pruning: at every
        point of a crash the records' best epoch has its complete best set on disk."""
        self.own_folders(model_folder)
        self._write_checkpoints(trainer, model_folder, epoch, is_new_best)
        for values, recorded_epoch, group in self._deferred or []:
            self.record_keeper.update_records(values, recorded_epoch, group, step_name="epoch")
        self.record_keeper.save_records()
        self._prune_replaced(trainer, model_folder, epoch, is_new_best)

    def _run_tester(
        self,
        tester: Any,
        epoch: int,
        models: Mapping[str, Any],
        dataset_dict: Any,
        splits: Any,
        collate_fn: Any,
    ) -> None:
        self._testing_epoch, self._recorded_by_hook = epoch, False
        try:
            tester.test(
                dataset_dict,
                epoch,
                models["trunk"],
                models.get("embedder"),
                splits_to_eval=splits,
                collate_fn=collate_fn,
            )
        finally:
            self._testing_epoch = None
        if not self._recorded_by_hook:
            self._record_accuracies(tester, epoch)

    def _epoch_of(self, tester: Any) -> int:
        if self._testing_epoch is not None:
            return self._testing_epoch
        for accuracies in dict(tester.all_accuracies).values():
            if isinstance(accuracies, Mapping) and "epoch" in accuracies:
                return int(accuracies["epoch"])
        epoch = getattr(tester, "epoch", None)
        if epoch is None:
            raise InvalidArgumentError(
                "end_of_testing_hook could not tell which epoch the tester evaluated: "
                "run the test through end_of_epoch_hook, or use a tester that stores the epoch."
            )
        return int(epoch)

    def _record_accuracies(self, tester: Any, epoch: int) -> None:
        writes = is_main_process()
        for split_name, accuracies in dict(tester.all_accuracies).items():
            values = numeric_accuracies(accuracies)
            self._best_for(split_name)  # read the history before this epoch joins it
            group = self.accuracy_group_name(split_name)
            if writes and self._deferred is not None:
                self._deferred.append((values, epoch, group))
            elif writes:
                self.record_keeper.update_records(values, epoch, group, step_name="epoch")
            self._update_best(split_name, epoch, values)
        if writes and self._deferred is None:
            self.record_keeper.save_records()

    def _update_best(self, split_name: str, epoch: int, values: Mapping[str, float]) -> None:
        key = resolve_metric_key(self.primary_metric, values)
        if key is None:
            if split_name == self.validation_split_name:
                self._recorded_key(self.primary_metric, list(values))  # raises
            return
        best = self._best.get(split_name)
        if is_better(values[key], best[1] if best else None):
            self._best[split_name] = (epoch, values[key])

    def _primary_value(self, accuracies: Mapping[str, Any]) -> float:
        values = numeric_accuracies(accuracies)
        return values[self._recorded_key(self.primary_metric, list(values))]

    def _recorded_key(self, metric: str, keys: list[str]) -> str:
        key = resolve_metric_key(metric, keys)
        if key is None:
            raise invalid("metric", _OWNER, f"a name that matches one of {keys}", metric)
        return key

    def _best_for(self, split_name: str) -> Best | None:
        if split_name not in self._best:
            self._best[split_name] = self._best_from_records(split_name)
        return self._best[split_name]

    def _best_from_records(self, split_name: str, ignored: Set[int] = frozenset()) -> Best | None:
        group = self.accuracy_group_name(split_name)
        key = resolve_metric_key(self.primary_metric, self.record_keeper.names(group))
        if key is None:
            return None
        best: Best | None = None
        epochs, values = self.record_keeper.history(group, [key])
        for epoch, value in zip(epochs, values[key]):
            if epoch not in ignored and is_better(value, best[1] if best else None):
                best = (epoch, value)
        return best

    def _saveable(self, trainer: Any) -> dict[str, Any]:
        objects: dict[str, Any] = {}
        for attribute in self.saveable_trainer_objects:
            for name, obj in dict(getattr(trainer, attribute, None) or {}).items():
                if obj is None or not hasattr(unwrap_model(obj), "state_dict"):
                    continue
                if name in objects:
                    raise invalid("trainer", _OWNER, "objects with distinct names", name)
                objects[name] = obj
        return objects

    @staticmethod
    def _prune(name: str, model_folder: PathLike, tag: str, remove: Callable[[int], bool]) -> None:
        for e in saved_epochs(model_folder, name, tag):
            if remove(e):
                delete_checkpoints([name], model_folder, f"{tag}{e}")

    def __repr__(self) -> str:
        return (
            f"HookContainer(primary_metric={self.primary_metric!r}, "
            f"validation_split_name={self.validation_split_name!r}, save_models={self.do_save_models})"
        )
