"""Choose the checkpoint set to resume from, reading everything and changing nothing.

An epoch's state is *committed* once every object's checkpoint is written and its
validation accuracies are in the records (the hooks write the checkpoints first and commit
the records after). Resume takes the newest committed set whose files all load; a set
with a bad file is skipped with a warning naming the file. When the folder's objects are
not the training state's objects, or records exist that no loadable set explains (a typo
in the folder, every set damaged), resuming would lose or mix data, so it stops with a
:class:`~pytorch_metric_learning.errors.ResumeError` before touching anything.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import CorruptFileError, ResumeError
from ..checkpoints import (
    EPOCH_DIGITS,
    PathLike,
    checkpoint_files,
    read_checkpoints,
    saved_epochs,
    saved_suffixes,
    set_aside,
)
from ..record_keeping import RecordKeeper

__all__ = [
    "ResumePoint",
    "find_resume_point",
    "files_after",
    "set_aside_after",
    "set_aside_everything",
    "epoch_files",
    "incomplete_sets",
    "check_no_best_set",
]

logger = logging.getLogger(__name__)

_EPOCH = re.compile(r".+_(?:best)?" + EPOCH_DIGITS + r"\.pth")
OwnsGroup = Callable[[str], bool]
_FRESH = (
    "Nothing was loaded, moved or deleted. Pass start_fresh=True to "
    "load_latest_saved_models to set the old checkpoints and records aside (they are "
    "moved, not deleted) and start at epoch 1."
)


@dataclass
class ResumePoint:
    """The epoch to resume after (0: nothing saved) and the states read for it."""

    epoch: int = 0
    suffix: str = ""
    states: dict[str, dict[str, Any]] = field(default_factory=dict)


def find_resume_point(
    names: Sequence[str], folder: PathLike, recorded: Sequence[int], map_location: Any
) -> ResumePoint:
    """The newest committed, loadable checkpoint set of ``names`` in ``folder``.

    Args:
        names: the objects of the training state.
        folder: the model folder.
        recorded: the epochs of the validation records (empty: no records).
        map_location: passed to ``torch.load``.

    Only the files of ``names`` count (``<name>_<epoch>.pth``, ``<name>_best<epoch>.pth``):
    any other ``.pth`` (pretrained weights named like ``resnet_50.pth``) is ignored. A set
    missing a file of one object (a save killed between two files) is incomplete: it is
    skipped with a warning, as a damaged one is.

    Raises:
        ResumeError: an object of ``names`` has no checkpoint at all although the others
            have checkpoints of recorded epochs (an object was added); or records exist
            but no set is committed and loadable; or complete sets of several epochs
            exist but no records.
    """
    files = epoch_files(folder, names)
    _check_same_objects(names, files, folder, recorded)
    candidates = _complete_sets(names, folder)
    _warn_incomplete(names, folder, candidates)
    if candidates and not recorded:
        return _without_records(folder, candidates)
    committed = [c for c in candidates if c[0] in recorded]
    for epoch, suffix in committed:
        try:
            return ResumePoint(epoch, suffix, read_checkpoints(names, folder, suffix, map_location))
        except (CorruptFileError, OSError) as error:
            _warn(f"Skipping the checkpoint set of epoch {epoch} ({suffix}): {error}")
    if recorded or candidates:
        raise ResumeError(_nothing_loadable(folder, files, recorded, candidates))
    return ResumePoint()


def incomplete_sets(names: Sequence[str], folder: PathLike) -> dict[str, list[str]]:
    """Suffixes (``"3"``, ``"best3"``) of which some but not all of ``names`` have a file,
    each with the objects whose file is missing."""
    by_suffix: dict[str, set[str]] = {}
    for tag in ("", "best"):
        for name in names:
            for epoch in saved_epochs(folder, name, tag):
                by_suffix.setdefault(f"{tag}{epoch}", set()).add(name)
    return {
        suffix: sorted(set(names) - owners)
        for suffix, owners in by_suffix.items()
        if owners != set(names)
    }


def _warn_incomplete(
    names: Sequence[str], folder: PathLike, candidates: Sequence[tuple[int, str]]
) -> None:
    """Warn about incomplete sets newer than the newest complete one."""
    newest = candidates[0][0] if candidates else 0
    for suffix, missing in sorted(incomplete_sets(names, folder).items()):
        if int(suffix.removeprefix("best")) > newest:
            _warn(
                f"Skipping the checkpoint set {suffix} of {str(folder)!r}: it is incomplete "
                f"(no file of {missing}; a save was interrupted between two files); resuming "
                "from the newest complete set."
            )


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    logger.warning(message)


def files_after(folder: PathLike, names: Sequence[str], epoch: int) -> list[Path]:
    """The checkpoint files of ``names`` (latest and best) of epochs after ``epoch``."""
    if not names:
        return []
    pattern = re.compile(
        "(?:" + "|".join(re.escape(n) for n in names) + r")_(?:best)?" + EPOCH_DIGITS + r"\.pth"
    )
    found = (pattern.fullmatch(p.name) for p in checkpoint_files(folder))
    return [Path(folder) / m.group(0) for m in found if m and int(m.group(1)) > epoch]


def set_aside_after(
    keeper: RecordKeeper, owns: OwnsGroup, epoch: int, names: Sequence[str], folder: PathLike
) -> None:
    """Set aside the records of the groups ``owns`` accepts and the checkpoint files of
    ``names`` of epochs after ``epoch`` (rows to ``superseded_records``, files to
    ``<folder>/superseded/``, TensorBoard event files to the log folder's ``superseded/``)."""
    moved = False
    for group in keeper.groups():
        if owns(group):
            moved = keeper.set_aside_after(group, epoch) or moved
    set_aside(files_after(folder, names, epoch), folder)
    if moved:
        keeper.set_aside_tensorboard()


def set_aside_everything(
    keeper: RecordKeeper, owns: OwnsGroup, folder: PathLike, names: Sequence[str]
) -> None:
    """What ``start_fresh=True`` does: every record of the groups ``owns`` accepts and
    every checkpoint file of ``names`` (exactly these objects) move aside."""
    moved = False
    for group in keeper.groups():
        if owns(group):
            moved = keeper.set_aside_after(group, None) or moved
    set_aside(epoch_files(folder, names), folder)
    if moved:
        keeper.set_aside_tensorboard()
    logger.info("Starting fresh: earlier checkpoints and records were set aside")


def check_no_best_set(names: Sequence[str], folder: PathLike, recorded_best: int | None) -> None:
    """Raise ResumeError when ``folder`` has no complete best set of ``names`` although
    the records name a best epoch. Without such records, best checkpoints of some of the
    objects only are an incomplete set (a first save killed between two files): a
    warning, and nothing to load."""
    owners = sorted(n for n in names if saved_epochs(folder, n, tag="best"))
    if recorded_best is None:
        if owners:
            _warn(
                f"The model folder {str(folder)!r} has best checkpoints of {owners} only, "
                "an incomplete set of no recorded epoch (a save interrupted between two "
                "files): there is no best model to load yet."
            )
        return
    found = f"best checkpoints of {owners} only" if owners else "no best checkpoint"
    raise ResumeError(
        f"Cannot load the best model from the model folder {str(folder)!r}: it has {found}, "
        f"so no complete best set of the objects {list(names)}"
        + ("" if recorded_best is None else f" (the records name epoch {recorded_best} best)")
        + ". Check the folder name and the objects given. Nothing was loaded."
    )


def epoch_files(folder: PathLike, names: Sequence[str]) -> list[Path]:
    """The checkpoint files of the objects ``names`` in ``folder`` (``<name>_<E>.pth``,
    ``<name>_best<E>.pth``, exactly these names): other ``.pth`` files (pretrained weights
    such as ``resnet_50.pth``, another run's objects) are not this run's checkpoints, so
    resume ignores them and never moves them."""
    return files_after(folder, names, -1)


def _complete_sets(names: Sequence[str], folder: PathLike) -> list[tuple[int, str]]:
    """(epoch, suffix) of every complete set, newest first, the latest set before the best."""
    sets = [(e, str(e)) for e in saved_suffixes(folder, names)]
    sets += [(e, f"best{e}") for e in saved_suffixes(folder, names, tag="best")]
    return sorted(sets, key=lambda s: (s[0], not s[1].startswith("best")), reverse=True)


def _epochs(files: Sequence[Path]) -> list[int]:
    return sorted({int(m.group(1)) for m in (_EPOCH.fullmatch(p.name) for p in files) if m})


def _check_same_objects(
    names: Sequence[str], files: Sequence[Path], folder: PathLike, recorded: Sequence[int]
) -> None:
    """An object with no checkpoint at all, while the others have checkpoints of recorded
    (committed) epochs, was added to the training state: resuming would train it from
    scratch next to restored ones. (Files of unrecorded epochs only are an interrupted
    first save, handled as an incomplete set.)"""
    if not files or not set(_epochs(files)) & set(recorded):
        return
    patterns = {n: re.compile(re.escape(n) + r"_(?:best)?\d+\.pth") for n in names}
    missing = [n for n in names if not any(patterns[n].fullmatch(p.name) for p in files)]
    if not missing:
        return
    raise ResumeError(
        f"Cannot resume from the model folder {str(folder)!r}: it holds checkpoints of "
        f"epochs {_epochs(files)} whose objects differ from the training state's. "
        f"Objects of the training state with no checkpoint: {missing}. "
        "Give the training state the objects of the saved run. " + _FRESH
    )


def _without_records(folder: PathLike, candidates: Sequence[tuple[int, str]]) -> ResumePoint:
    """Checkpoints but no validation records: the save of the first validated epoch was
    interrupted before its commit (one epoch: its files are uncommitted, set aside by the
    caller, and training starts over), or the records are elsewhere (a typo in the record
    folder): resuming would then forget the best epoch and prune its checkpoint."""
    epochs = sorted({epoch for epoch, _ in candidates})
    if len(epochs) > 1:
        raise ResumeError(
            f"Cannot resume from the model folder {str(folder)!r}: it has complete "
            f"checkpoint sets of epochs {epochs}, but the records hold no validation "
            "results, so the best epoch is unknown. Check the record folder (a typo gives "
            "empty records), record_group_name_prefix and validation_split_name. " + _FRESH
        )
    _warn(
        f"The checkpoints of epoch {epochs[0]} in {str(folder)!r} have no validation "
        "records (a save interrupted before its commit): they are set aside, and "
        "training starts at epoch 1."
    )
    return ResumePoint()


def _nothing_loadable(
    folder: PathLike, files: Sequence[Path], recorded: Sequence[int], sets: Sequence[Any]
) -> str:
    found = f"checkpoint files of epochs {_epochs(files)}" if files else "no checkpoint files"
    return (
        f"Cannot resume from the model folder {str(folder)!r}: it has {found}, and no "
        f"complete, loadable checkpoint set of an epoch the records hold (complete sets: "
        f"{[suffix for _, suffix in sets]}; recorded validation epochs: {list(recorded)}). "
        "Check the folder name (a typo gives an empty folder). " + _FRESH
    )
