"""Save and load model checkpoints so that a crash never leaves a half-written file behind.

A checkpoint of the object called ``name`` (a model, an optimizer, a scheduler: anything with
``state_dict``/``load_state_dict``) is the file ``<name>_<suffix>.pth`` in a model folder. Files
are written to a temporary file in the same folder and then renamed over the target with
:func:`os.replace`, which is atomic on POSIX and Windows: a reader sees the old file or the
new one, never a mix. Loading uses ``torch.load(weights_only=True)``, so a checkpoint cannot
run code, and strips the ``module.`` prefix that ``DataParallel`` and
``DistributedDataParallel`` add to parameter names.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import torch

from .._atomic import fsync_folder, refuse_linked_folders, remove_leftovers, write_atomically
from .._validation import invalid
from ..errors import CorruptFileError, FileWriteError, InvalidTypeError

__all__ = [
    "checkpoint_path",
    "save_state_dict",
    "load_state_dict",
    "strip_module_prefix",
    "unwrap_model",
    "save_checkpoints",
    "load_checkpoints",
    "read_checkpoints",
    "apply_checkpoints",
    "checkpoint_files",
    "set_aside",
    "delete_checkpoints",
    "saved_epochs",
    "saved_suffixes",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_SUFFIX_PATTERN = re.compile(r"[A-Za-z0-9_\-]+")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# An epoch in a checkpoint's name is a canonical decimal (no sign, no leading zero, ASCII
# digits only): ``trunk_01.pth`` is not the library's file for epoch 1, it is a user's.
EPOCH_DIGITS = r"(0|[1-9][0-9]*)"
_CHECKPOINT_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*_[A-Za-z0-9_\-]+\.pth")


def _check_name(name: Any, param: str = "name", pattern: re.Pattern[str] = _NAME_PATTERN) -> str:
    if not isinstance(name, str):
        raise invalid(param, "checkpoint_path", "a str", name, InvalidTypeError)
    if not pattern.fullmatch(name) or ".." in name:
        raise invalid(
            param,
            "checkpoint_path",
            "made of letters, digits, '_', '-' (and '.' inside a name), so that the file "
            "stays inside the model folder",
            name,
        )
    return name


def checkpoint_path(folder: PathLike, name: str, suffix: str | int) -> Path:
    """Return ``<folder>/<name>_<suffix>.pth``, refusing names that could leave ``folder``.

    Args:
        folder: the model folder.
        name: the object's name, e.g. ``"trunk"`` or ``"trunk_optimizer"``.
        suffix: an epoch (``3``) or a tag such as ``"best3"``.

    Raises:
        InvalidArgumentError: ``name`` or ``suffix`` holds a path separator, ``..``, or
            another character that is not a letter, digit, ``_``, ``-`` or ``.``.

    Example:
        >>> checkpoint_path("saved_models", "trunk", "best3").as_posix()
        'saved_models/trunk_best3.pth'
    """
    _check_name(name)
    _check_name(str(suffix), "suffix", _SUFFIX_PATTERN)
    return Path(folder) / f"{name}_{suffix}.pth"


def unwrap_model(obj: Any) -> Any:
    """Return the module inside ``DataParallel``/``DistributedDataParallel``, else ``obj``.

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> unwrap_model(torch.nn.DataParallel(layer)) is layer
        True
    """
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while isinstance(obj, wrappers):
        obj = obj.module
    return obj


def strip_module_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``module.`` (or ``torch.compile``'s ``_orig_mod.``) prefix of every key.

    A prefix is removed only when every key carries it, so a model that merely has a
    submodule called ``module`` keeps its names.

    Example:
        >>> strip_module_prefix({"module.weight": 1, "module.bias": 2})
        {'weight': 1, 'bias': 2}
        >>> strip_module_prefix({"module.weight": 1, "bias": 2})
        {'module.weight': 1, 'bias': 2}
    """
    out = dict(state_dict)
    changed = True
    while changed and out:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(isinstance(k, str) and k.startswith(prefix) for k in out):
                out = {k[len(prefix) :]: v for k, v in out.items()}
                changed = True
    return out


def save_state_dict(state: Mapping[str, Any], path: PathLike) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file, fsync, then ``os.replace``.

    If anything fails (disk full, the process is interrupted by an exception) the temporary
    file is removed and whatever was at ``path`` before is left untouched.

    Raises:
        FileWriteError: the file could not be written (an ``OSError`` naming ``path``).

    Example:
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> save_state_dict({"w": torch.ones(2)}, os.path.join(folder, "m_1.pth"))
        >>> sorted(os.listdir(folder))
        ['m_1.pth']
    """
    path = Path(path)
    _write_state(state, path)
    fsync_folder(path.parent)


def _write_state(state: Mapping[str, Any], path: Path) -> None:
    write_atomically(path, lambda handle: torch.save(dict(state), handle), "checkpoint")


def load_state_dict(path: PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` and strip wrapper prefixes.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m_1.pth")
        >>> torch.save({"module.w": torch.zeros(1)}, path)
        >>> load_state_dict(path)
        {'w': tensor([0.])}

    Raises:
        CorruptFileError: the file exists but is not a loadable state dict (zero bytes,
            truncated, garbage); the message names the file.
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as error:  # torch raises EOFError, RuntimeError, UnpicklingError, ...
        raise CorruptFileError(
            f"The checkpoint {str(path)!r} cannot be read ({type(error).__name__}: {error}). "
            "It is truncated, empty, damaged, or not a weights-only state dict saved by "
            "torch.save."
        ) from error
    if not isinstance(state, Mapping):
        raise CorruptFileError(
            f"The checkpoint {str(path)!r} holds a {type(state).__name__}, not a state dict."
        )
    return strip_module_prefix(state)


def _saveable(objects: Mapping[str, Any]) -> dict[str, Any]:
    return {k: unwrap_model(v) for k, v in objects.items() if hasattr(v, "state_dict")}


def save_checkpoints(objects: Mapping[str, Any], folder: PathLike, suffix: str | int) -> None:
    """Save each object's ``state_dict`` as ``<name>_<suffix>.pth`` in ``folder``.

    Objects without ``state_dict`` (plain functions used as losses, say) are skipped. Each
    file is written atomically; after a successful save, temporary files left in ``folder``
    by an earlier interrupted save are removed.

    Example:
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, 1)
        >>> os.listdir(folder)
        ['trunk_1.pth']
    """
    for name, obj in _saveable(objects).items():
        _write_state(obj.state_dict(), checkpoint_path(folder, name, suffix))
    fsync_folder(Path(folder))
    remove_leftovers(Path(folder), _CHECKPOINT_FILE)


def load_checkpoints(
    objects: Mapping[str, Any], folder: PathLike, suffix: str | int, map_location: Any = "cpu"
) -> None:
    """Load ``<name>_<suffix>.pth`` from ``folder`` into each object, in place.

    A wrapped model (``DataParallel``/``DDP``) is loaded through its inner module, so
    checkpoints of wrapped and plain models are interchangeable. The whole set is read
    before any object changes, and an object that refuses its state dict puts back the
    ones already loaded: either every object is loaded or none is.

    Raises:
        FileNotFoundError: a file of the set is missing.
        CorruptFileError: a file is unreadable or does not fit its object (names the file).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> save_checkpoints({"trunk": torch.nn.DataParallel(source)}, folder, 1)
        >>> load_checkpoints({"trunk": target}, folder, 1)
        >>> bool(torch.equal(source.weight, target.weight))
        True
    """
    saveable = _saveable(objects)
    files = {name: checkpoint_path(folder, name, suffix) for name in saveable}
    apply_checkpoints(saveable, read_checkpoints(saveable, folder, suffix, map_location), files)
    logger.info("Loaded the checkpoints %s_%s.pth from %s", list(saveable), suffix, folder)


def apply_checkpoints(
    objects: Mapping[str, Any],
    states: Mapping[str, Mapping[str, Any]],
    files: Mapping[str, PathLike] | None = None,
) -> None:
    """Load ``states[name]`` into each object: all of them, or (on an error) none.

    Models and optimizers are checked against their state first (parameter names and
    shapes, parameter groups), so they need no backup copy; other objects (schedulers,
    say) are small and are copied, to be put back if a later object refuses its state.

    Args:
        objects: the objects to load, by name.
        states: their state dicts, by name.
        files: the file each state was read from, by name, for the error messages.

    Raises:
        CorruptFileError: a state does not fit its object (the message names the file);
            the objects already loaded are put back (the message names any that could
            not be).

    Example:
        >>> source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> apply_checkpoints({"trunk": target}, {"trunk": source.state_dict()})
        >>> bool(torch.equal(source.weight, target.weight))
        True
    """
    saveable = _saveable(objects)
    for name, obj in saveable.items():
        _check_fits(_label(name, files), obj, states[name])
    # Unchecked objects first, each with a backup: if one refuses, only they need undoing.
    order = sorted(saveable, key=lambda name: _is_checked(saveable[name]))
    done: list[tuple[str, Any]] = []
    for name in order:
        obj = saveable[name]
        backup = None if _is_checked(obj) else copy.deepcopy(obj.state_dict())
        try:
            obj.load_state_dict(states[name])
        except Exception as error:
            with contextlib.suppress(Exception):
                obj.load_state_dict(backup)
            changed = _undo(done, saveable)
            raise CorruptFileError(
                f"The saved state of {_label(name, files)} does not fit that object "
                f"({type(error).__name__}: {error}); "
                + (f"the objects {changed} stay loaded." if changed else "no object was changed.")
            ) from error
        done.append((name, backup))


def _label(name: str, files: Mapping[str, PathLike] | None) -> str:
    """``'trunk'``, or ``'trunk' (file 'models/trunk_3.pth')`` when the file is known."""
    path = (files or {}).get(name)
    return repr(name) if path is None else f"{name!r} (file {str(path)!r})"


def _undo(done: list[tuple[str, Any]], objects: Mapping[str, Any]) -> list[str]:
    """Put back the loaded objects from their backups; return those that could not be."""
    changed = []
    for name, backup in reversed(done):
        try:
            objects[name].load_state_dict(backup)
        except Exception:
            changed.append(name)
    return sorted(changed)


def _is_checked(obj: Any) -> bool:
    return isinstance(obj, (torch.nn.Module, torch.optim.Optimizer))


def _check_fits(label: str, obj: Any, state: Mapping[str, Any]) -> None:
    """Raise CorruptFileError when a model's or optimizer's state cannot load into it."""
    problem = None
    if isinstance(obj, torch.nn.Module):
        expected = {k: _shape(v) for k, v in obj.state_dict().items()}
        got = {k: _shape(v) for k, v in state.items()}
        if expected != got:
            wrong = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
            problem = (
                f"missing {sorted(expected.keys() - got.keys())}, unexpected "
                f"{sorted(got.keys() - expected.keys())}, other shapes {wrong}"
            )
    elif isinstance(obj, torch.optim.Optimizer):
        sizes = [len(group["params"]) for group in obj.param_groups]
        groups = state.get("param_groups")
        saved = [len(g.get("params", ())) for g in groups] if isinstance(groups, list) else None
        if saved != sizes:
            problem = f"parameter groups of sizes {saved}, the optimizer's are {sizes}"
    if problem:
        raise CorruptFileError(
            f"The saved state of {label} does not fit that object ({problem}); "
            "no object was changed."
        )


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def read_checkpoints(
    names: Iterable[str], folder: PathLike, suffix: str | int, map_location: Any = "cpu"
) -> dict[str, dict[str, Any]]:
    """Read ``<name>_<suffix>.pth`` of every name, so that a set is checked whole first.

    Raises:
        FileNotFoundError: a file of the set is missing.
        CorruptFileError: a file of the set is not a loadable state dict.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 1)}, folder, 1)
        >>> sorted(read_checkpoints(["trunk"], folder, 1)["trunk"])
        ['bias', 'weight']
    """
    return {
        name: load_state_dict(checkpoint_path(folder, name, suffix), map_location) for name in names
    }


def delete_checkpoints(names: Iterable[str], folder: PathLike, suffix: str | int) -> None:
    """Remove ``<name>_<suffix>.pth`` for each name; files that are already gone are fine.

    Example:
        >>> import tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, 1)
        >>> delete_checkpoints(["trunk"], folder, 1)
        >>> os.listdir(folder)
        []
    """
    for name in names:
        path = checkpoint_path(folder, name, suffix)
        if path.is_file() or path.is_symlink():  # never a folder named like a checkpoint
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def saved_epochs(folder: PathLike, name: str, tag: str = "") -> list[int]:
    """Epochs ``E`` for which the file ``<name>_<tag><E>.pth`` exists in ``folder``, ascending.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, 3)
        >>> saved_epochs(folder, "trunk"), saved_epochs(folder, "trunk", tag="best")
        ([3], [])
    """
    _check_name(name)
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(f"{name}_{tag}") + EPOCH_DIGITS + r"\.pth")
    matches = (pattern.fullmatch(p.name) for p in folder.iterdir())
    # Only regular files (or links to one): a folder named like a checkpoint is not one.
    return sorted({int(m.group(1)) for m in matches if m and (folder / m.group(0)).is_file()})


def saved_suffixes(folder: PathLike, names: Iterable[str], tag: str = "") -> list[int]:
    """Epochs ``E`` for which ``<name>_<tag><E>.pth`` exists for *every* name, ascending.

    Requiring every name makes a save interrupted half-way (the trunk written, the
    embedder not) invisible: only complete sets count.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, "best4")
        >>> saved_suffixes(folder, ["trunk"], tag="best")
        [4]
    """
    sets = [set(saved_epochs(folder, name, tag)) for name in names]
    return sorted(set.intersection(*sets)) if sets else []


def checkpoint_files(folder: PathLike) -> list[Path]:
    """The files of ``folder`` named like checkpoints (``<name>_<suffix>.pth``), sorted.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, "best2")
        >>> [p.name for p in checkpoint_files(folder)]
        ['trunk_best2.pth']
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _CHECKPOINT_FILE.fullmatch(p.name) and p.is_file())


def set_aside(paths: Iterable[Path], folder: PathLike) -> Path | None:
    """Move ``paths`` into ``<folder>/superseded/<UTC time>/`` (nothing is deleted); return
    that folder, or None when there was nothing to move.

    Raises:
        FileWriteError: a file could not be moved (a read-only folder, a file called
            ``superseded``); the files not moved stay where they were.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_checkpoints({"trunk": torch.nn.Linear(2, 2)}, folder, 5)
        >>> moved_to = set_aside(checkpoint_files(folder), folder)
        >>> [p.name for p in moved_to.iterdir()], checkpoint_files(folder)
        (['trunk_5.pth'], [])
    """
    paths = list(paths)
    if not paths:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = Path(folder) / "superseded" / stamp
    for attempt in range(1, 1000):
        if not target.exists():
            break
        target = Path(folder) / "superseded" / f"{stamp}-{attempt}"
    refuse_linked_folders(Path(folder), target / "x", "superseded checkpoint folder")
    try:
        target.mkdir(parents=True)
        for path in paths:
            os.replace(path, target / path.name)
    except OSError as error:
        raise FileWriteError(
            f"Could not move superseded checkpoint files of {str(folder)!r} to "
            f"{str(target)!r} ({error}); the files not moved are where they were."
        ) from error
    fsync_folder(Path(folder))
    logger.warning("Moved %d superseded checkpoint files to %s", len(paths), target)
    return target
