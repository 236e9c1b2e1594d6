"""The methods of 2.x's ``HookContainer`` that 2.x user code calls, over the new records.

2.x read its SQLite tables with hand-written queries; here every read goes through the
record keeper (``history``/``names``), so rows are plain dicts ``{"epoch": e, <key>: v}``
and nothing is written or deleted by a query. Keys are tried as 2.x tried them: the
tester's ``AVERAGE_<metric>`` key first, then ``<metric>_level<L>``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from ..._validation import check_positive_int, invalid
from ...errors import InvalidTypeError, MetricNotRecordedError
from .metric_keys import is_better, resolve_metric_key

if TYPE_CHECKING:
    from ..record_keeping import RecordKeeper

__all__ = [
    "ITERATION_2X",
    "EmptyContainer",
    "HookContainer2xMethods",
    "check_2x_record_options",
    "is_logged_iteration",
    "running_best",
]

# 2.x's record keeper named the iteration column of loss histories "~iteration~".
ITERATION_2X = "~iteration~"

Row = dict[str, Any]
logger = logging.getLogger(__name__)


def check_2x_record_options(global_db_path: Any, save_lists: Any) -> None:
    """Refuse the 2.x ``get_record_keeper`` options that have no equivalent here, rather
    than ignore them (records would silently go elsewhere, or lists be dropped)."""
    if global_db_path is not None:
        raise invalid(
            "global_db_path",
            "get_record_keeper",
            "None (a database shared by several experiments is not supported: each run "
            "keeps <csv_folder>/records.db, or the file given as db_path=)",
            global_db_path,
        )
    if save_lists is not False:
        raise invalid(
            "save_lists",
            "get_record_keeper",
            "False (records hold one number per name and step)",
            save_lists,
        )


def is_logged_iteration(trainer: Any, log_freq: int) -> bool:
    """Whether 2.x's hooks recorded this iteration: ``trainer.iteration % log_freq == 0``.

    ``trainer.iteration`` counts from 0 within each epoch, so each epoch's first
    iteration is recorded. An object without ``iteration`` (a hand-written loop's state)
    is recorded every time.

    Example:
        >>> from types import SimpleNamespace
        >>> [is_logged_iteration(SimpleNamespace(iteration=i), 2) for i in range(4)]
        [True, False, True, False]
    """
    iteration = getattr(trainer, "iteration", None)
    return iteration is None or int(iteration) % log_freq == 0


def running_best(primary_metric: str, history: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """2.x's ``best_epoch`` and ``best_accuracy`` columns of an accuracy history.

    Entry ``i`` is the best epoch (the first whose primary metric is strictly greater
    than every earlier one; NaN is never best) among epochs ``history["epoch"][: i + 1]``
    and its value: what 2.x's ``end_of_testing_hook`` recorded after each test. Before any
    best, ``(None, 0.0)``, as 2.x's ``get_best_epoch_and_accuracy``. ``{}`` when the
    primary metric is not in ``history``.

    Example:
        >>> running_best("p", {"epoch": [1, 2, 3], "p_level0": [0.5, 0.4, 0.7]})
        {'best_epoch': [1, 1, 3], 'best_accuracy': [0.5, 0.5, 0.7]}
    """
    key = resolve_metric_key(primary_metric, [k for k in history if k != "epoch"])
    if key is None:
        return {}
    best_epoch: Any = None
    best: float | None = None
    epochs, accuracies = [], []
    for epoch, value in zip(history["epoch"], history[key]):
        if value is not None and is_better(float(value), best):
            best_epoch, best = epoch, float(value)
        epochs.append(best_epoch)
        accuracies.append(0.0 if best is None else best)
    return {"best_epoch": epochs, "best_accuracy": accuracies}


def _keyname(tester: Any, metric: str, average: bool) -> str:
    level = getattr(tester, "label_hierarchy_level", 0)
    level = level if isinstance(level, int) and not isinstance(level, bool) else 0
    return str(tester.accuracies_keyname(metric, average=average, label_hierarchy_level=level))


def _pick(row: Row, key: str, select_all: bool) -> Row:
    return dict(row) if select_all else {"epoch": row["epoch"], key: row[key]}


def _query_name(entry: Any) -> str:
    return entry if isinstance(entry, str) else entry[0]


def _as_pair(entry: Any) -> Any:
    return (entry, [entry]) if isinstance(entry, str) else entry


class HookContainer2xMethods:
    """2.x's ``HookContainer`` methods, mixed into :class:`HookContainer`."""

    if TYPE_CHECKING:
        record_keeper: RecordKeeper
        primary_metric: str
        validation_split_name: str

        def accuracy_group_name(self, split_name: str) -> str: ...
        def get_best_epoch_and_accuracy(
            self, tester: Any, split_name: str, ignore_epoch: Sequence[int] = (-1,)
        ) -> tuple[int | None, float]: ...
        def _validate_and_save(
            self, trainer: Any, tester: Any, model_folder: Any, dataset_dict: Any, *args: Any
        ) -> int | None: ...
        def _run_tester(
            self, tester: Any, epoch: int, models: Any, dataset_dict: Any, s: Any, c: Any
        ) -> None: ...

    # ------------------------------------------------------------------ keys
    def try_keys(
        self, input_keys: Sequence[str], tester: Any, input_func: Callable[[str], Any]
    ) -> Any:
        """Call ``input_func`` with the tester's ``AVERAGE_`` keys of ``input_keys`` (joined
        by ``", "``), then with their ``_level<L>`` keys; return the first result that does
        not raise ``KeyError``.

        Raises:
            MetricNotRecordedError: neither form of the keys worked (also a ``KeyError``).
        """
        tried = []
        for average in (True, False):
            keys = ", ".join(_keyname(tester, k, average) for k in input_keys)
            tried.append(keys)
            try:
                return input_func(keys)
            except (KeyError, sqlite3.OperationalError):
                continue
        raise MetricNotRecordedError(
            f"None of the keys {tried} for the metrics {list(input_keys)} were found; check "
            "the HookContainer's primary_metric and the tester's accuracy calculator."
        )

    def try_primary_metric(self, tester: Any, input_func: Callable[[str], Any]) -> Any:
        """:meth:`try_keys` with the container's ``primary_metric``."""
        return self.try_keys([self.primary_metric], tester, input_func)

    def get_curr_primary_metric(self, tester: Any, split_name: str) -> Any:
        """The primary metric in ``tester.all_accuracies[split_name]`` (the last test)."""
        return self.try_primary_metric(tester, lambda key: tester.all_accuracies[split_name][key])

    # ------------------------------------------------------------------ records
    def _epoch_rows(self, split_name: str) -> list[Row] | None:
        """Every recorded epoch of a split as ``{"epoch": e, <key>: value, ...}``; None if
        the split has no records."""
        group = self.accuracy_group_name(split_name)
        names = self.record_keeper.names(group)
        if not names:
            return None
        epochs, values = self.record_keeper.history(group, names)
        return [{"epoch": e, **{n: values[n][i] for n in names}} for i, e in enumerate(epochs)]

    def get_accuracies_of_epoch(
        self, tester: Any, split_name: str, epoch: int, select_all: bool = True
    ) -> list[Row]:
        """The records of ``split_name`` at ``epoch``: ``[row]``, or ``[]`` if not recorded.

        A row holds every recorded metric (``select_all``) or only ``epoch`` and the primary
        metric's key.
        """
        rows = self._epoch_rows(split_name)
        if rows is None:
            return []

        def select(key: str) -> list[Row]:
            if key not in rows[0]:
                raise KeyError(key)
            return [_pick(r, key, select_all) for r in rows if r["epoch"] == epoch]

        return list(self.try_primary_metric(tester, select))

    def get_accuracies_of_best_epoch(
        self,
        tester: Any,
        split_name: str,
        select_all: bool = True,
        ignore_epoch: Sequence[int] = (-1,),
    ) -> tuple[list[Row], str | None]:
        """The rows whose primary metric is the largest, among the recorded epochs not in
        ``ignore_epoch`` (NaN never counts), and the key of the primary metric;
        ``([], None)`` before anything is recorded."""
        rows = self._epoch_rows(split_name)
        if rows is None:
            return [], None
        ignored = set(ignore_epoch)

        def select(key: str) -> tuple[list[Row], str]:
            if key not in rows[0]:
                raise KeyError(key)
            kept = [r for r in rows if r["epoch"] not in ignored and not math.isnan(r[key])]
            best = max((r[key] for r in kept), default=None)
            return [_pick(r, key, select_all) for r in kept if r[key] == best], key

        rows_and_key: tuple[list[Row], str] = self.try_primary_metric(tester, select)
        return rows_and_key

    def is_new_best_accuracy(
        self, tester: Any, split_name: str, epoch: int
    ) -> tuple[bool, Any, int | None, float]:
        """Whether the tester's current primary metric beats every recorded epoch but
        ``epoch``: ``(is_new_best, curr_accuracy, best_epoch, best_accuracy)``, where the
        best is ``(epoch, curr_accuracy)`` when it does. NaN is never a new best."""
        curr = self.get_curr_primary_metric(tester, split_name)
        best_epoch, best = self.get_best_epoch_and_accuracy(tester, split_name, (epoch,))
        if is_better(float(curr), None if best_epoch is None else best):
            return True, curr, epoch, curr
        return False, curr, best_epoch, best

    # ------------------------------------------------------------------ testing
    def save_models_and_eval(
        self,
        trainer: Any,
        dataset_dict: Mapping[str, Any],
        model_folder: Any,
        test_interval: int,
        tester: Any,
        splits_to_eval: Sequence[Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
    ) -> int | None:
        """Test ``trainer.epoch``, record it, save the latest (and a new best) checkpoint,
        as ``end_of_epoch_hook`` does; return the best epoch of the validation split."""
        check_positive_int(test_interval, "test_interval", "save_models_and_eval")
        pairs = None if splits_to_eval is None else [_as_pair(s) for s in splits_to_eval]
        return self._validate_and_save(
            trainer, tester, model_folder, dataset_dict, pairs, collate_fn
        )

    def get_splits_to_eval(
        self,
        tester: Any,
        dataset_dict: Mapping[str, Any],
        epoch: int,
        input_splits_to_eval: Sequence[Any] | None,
    ) -> list[Any]:
        """The entries of ``input_splits_to_eval`` (default: every split against itself)
        whose query split has no records at ``epoch``."""
        if input_splits_to_eval is None:
            input_splits_to_eval = [(name, [name]) for name in dataset_dict]
        return [
            _as_pair(entry)
            for entry in input_splits_to_eval
            if not self.get_accuracies_of_epoch(tester, _query_name(entry), epoch)
        ]

    def run_tester_separately(
        self,
        tester: Any,
        dataset_dict: Mapping[str, Any],
        epoch: int,
        trunk: Any,
        embedder: Any = None,
        splits_to_eval: Sequence[Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        skip_eval_if_already_done: bool = True,
    ) -> bool:
        """Test saved models outside training, recording the accuracies of ``epoch``.

        With ``skip_eval_if_already_done``, splits already recorded at ``epoch`` are not
        tested again; returns False when nothing was left to test.
        """
        if not isinstance(skip_eval_if_already_done, bool):
            expected = "a bool"
            raise invalid(
                "skip_eval_if_already_done", "run_tester_separately", expected,
                skip_eval_if_already_done, InvalidTypeError,
            )  # fmt: skip
        if skip_eval_if_already_done:
            splits_to_eval = self.get_splits_to_eval(tester, dataset_dict, epoch, splits_to_eval)
            if not splits_to_eval:
                logger.info("Already evaluated at epoch %d", epoch)
                return False
        elif splits_to_eval is not None:
            splits_to_eval = [_as_pair(s) for s in splits_to_eval]
        models = {"trunk": trunk, "embedder": embedder}
        self._run_tester(tester, epoch, models, dataset_dict, splits_to_eval, collate_fn)
        return True

    @staticmethod
    def optimizer_custom_attr_func(optimizer: Any) -> dict[str, float]:
        """``{"lr": <the learning rate of the optimizer's first parameter group>}``."""
        return {"lr": float(optimizer.param_groups[0]["lr"])}


class EmptyContainer:
    """What 2.x's ``get_hook_container(None)`` returned: hooks that do nothing.

    Example:
        >>> hooks = EmptyContainer()
        >>> hooks.end_of_epoch_hook("tester", {}, "models") is None, hooks.end_of_testing_hook
        (True, None)
    """

    end_of_iteration_hook = None
    end_of_testing_hook = None

    def end_of_epoch_hook(self, *args: Any) -> None:
        """None: a trainer given None as its ``end_of_epoch_hook`` runs every epoch."""
        return None
