"""Ready-made record keeper and hook container, as in pytorch-metric-learning 2.x."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Union, overload

from ..record_keeping import RecordKeeper, SQLiteManager, make_tensorboard_writer
from ._hooks_2x import EmptyContainer, check_2x_record_options
from ._rank import is_main_process
from .hook_container import HookContainer

__all__ = ["get_record_keeper", "get_hook_container", "EmptyContainer"]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


def get_record_keeper(
    csv_folder: PathLike,
    tensorboard_folder: PathLike | None = None,
    global_db_path: PathLike | None = None,
    experiment_name: str | None = None,
    is_new_experiment: bool = True,
    save_lists: bool = False,
    *,
    db_path: PathLike | None = None,
) -> tuple[RecordKeeper, SQLiteManager, Any]:
    """Build a record keeper writing CSV files, a SQLite database and, optionally, TensorBoard.

    Args:
        csv_folder: folder of the per-metric CSV files (created if needed).
        tensorboard_folder: TensorBoard log folder; None disables TensorBoard. Needs the
            ``tensorboard`` extra.
        global_db_path: 2.x's database shared by several experiments; not supported:
            anything but None raises.
        experiment_name: 2.x's name of the run in ``global_db_path``; accepted and unused
            (as in 2.x without ``global_db_path``).
        is_new_experiment: as ``experiment_name``.
        save_lists: 2.x's option to record lists; only False (records are numbers).
        db_path: the SQLite file (keyword only); default ``<csv_folder>/records.db``.

    Returns:
        ``(record_keeper, sqlite_manager, tensorboard_writer)``; the writer is None without a
        TensorBoard folder, and under ``torch.distributed`` on every rank but rank 0 (which
        alone records, see :class:`HookContainer`).

    Raises:
        BackendNotInstalledError: a TensorBoard folder is given but ``tensorboard`` is
            not installed.
        InvalidArgumentError: ``global_db_path`` is not None or ``save_lists`` is not False.

    Example:
        >>> import tempfile
        >>> record_keeper, db, writer = get_record_keeper(tempfile.mkdtemp())
        >>> writer is None, db.path.name
        (True, 'records.db')
    """
    check_2x_record_options(global_db_path, save_lists)
    sqlite_manager = SQLiteManager(Path(db_path) if db_path else Path(csv_folder) / "records.db")
    writer = None
    if tensorboard_folder and is_main_process():  # only rank 0 records (see HookContainer)
        writer = make_tensorboard_writer(tensorboard_folder)
    record_keeper = RecordKeeper(csv_folder, sqlite_manager, writer)
    return record_keeper, sqlite_manager, writer


@overload
def get_hook_container(
    record_keeper: None,
    primary_metric: str = ...,
    validation_split_name: str = ...,
    save_models: bool = ...,
    log_freq: int = ...,
    record_group_name_prefix: str | None = ...,
) -> EmptyContainer: ...


@overload
def get_hook_container(
    record_keeper: RecordKeeper,
    primary_metric: str = ...,
    validation_split_name: str = ...,
    save_models: bool = ...,
    log_freq: int = ...,
    record_group_name_prefix: str | None = ...,
) -> HookContainer: ...


def get_hook_container(
    record_keeper: RecordKeeper | None,
    primary_metric: str = "mean_average_precision_at_r",
    validation_split_name: str = "val",
    save_models: bool = True,
    log_freq: int = 50,
    record_group_name_prefix: str | None = None,
) -> HookContainer | EmptyContainer:
    """Build a :class:`HookContainer` (see its documentation for the arguments).

    As in 2.x, ``record_keeper=None`` gives an :class:`EmptyContainer` (hooks that do
    nothing) and logs a warning.

    Example:
        >>> import tempfile
        >>> record_keeper, _, _ = get_record_keeper(tempfile.mkdtemp())
        >>> get_hook_container(record_keeper, primary_metric="precision_at_1")
        HookContainer(primary_metric='precision_at_1', validation_split_name='val', save_models=True)
    """
    if record_keeper is None:
        logger.warning("No record_keeper, so no preset hooks are being returned.")
        return EmptyContainer()
    return HookContainer(
        record_keeper,
        record_group_name_prefix=record_group_name_prefix,
        primary_metric=primary_metric,
        validation_split_name=validation_split_name,
        save_models=save_models,
        log_freq=log_freq,
    )
