"""Model files with the names and behaviour of 2.x's ``common_functions``.

``<folder>/<name>_<identifier>.pth`` holds one model's ``state_dict``. Saves go through
:func:`pytorch_metric_learning.utils.checkpoints.save_state_dict` (a temporary file, then
an atomic rename) and loads through its ``load_state_dict`` (``weights_only=True``, the
``module.`` prefix of ``DataParallel`` stripped), as the hooks save and load.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Callable

import torch

from .._validation import invalid
from ..errors import InvalidTypeError
from .checkpoints import load_state_dict, save_state_dict, unwrap_model

__all__ = [
    "modelpath_creator",
    "save_model",
    "load_model",
    "latest_version",
    "save_dict_of_models",
    "load_dict_of_models",
    "delete_dict_of_models",
    "operate_on_dict_of_models",
]

logger = logging.getLogger(__name__)

_EPOCH = re.compile(r"([0-9]+)\.pth$")
_BEST_EPOCH = re.compile(r"best([0-9]+)\.pth$")


def modelpath_creator(folder: str, basename: str, identifier: Any, extension: str = ".pth") -> str:
    """``folder/basename_identifier.pth`` (``folder/basename.pth`` without an identifier).

    Example:
        >>> modelpath_creator("models", "trunk", "best3")
        'models/trunk_best3.pth'
    """
    if identifier is None:
        return os.path.join(folder, basename + extension)
    return os.path.join(folder, f"{basename}_{identifier}{extension}")


def save_model(model: Any, filepath: str) -> None:
    """Save the ``state_dict`` of ``model`` (unwrapped from ``DataParallel``) atomically.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "trunk_1.pth")
        >>> save_model(torch.nn.DataParallel(torch.nn.Linear(2, 2)), path)
        >>> sorted(torch.load(path, weights_only=True))
        ['bias', 'weight']
    """
    model = unwrap_model(model)
    if not hasattr(model, "state_dict"):
        raise invalid("model", "save_model", "an object with state_dict()", model, InvalidTypeError)
    save_state_dict(model.state_dict(), filepath)


def load_model(model_def: torch.nn.Module, model_filename: str, device: Any) -> None:
    """Load a saved ``state_dict`` into ``model_def``, weights only, onto ``device``.

    Files saved from a ``DataParallel`` model (``module.`` keys) load into plain models
    and the other way round.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "trunk_1.pth")
        >>> source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> save_model(source, path)
        >>> load_model(target, path, "cpu")
        >>> bool(torch.equal(source.weight, target.weight))
        True
    """
    unwrap_model(model_def).load_state_dict(load_state_dict(model_filename, map_location=device))


def latest_version(
    folder: str, string_to_glob: str = "trunk_*.pth", best: bool = False
) -> tuple[int, Any]:
    """The highest saved epoch matching ``string_to_glob`` and its suffix; ``(0, None)`` if none.

    With ``best=True`` only ``..._best<N>.pth`` files count and the suffix is ``"best<N>"``.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> for name in ("trunk_3.pth", "trunk_12.pth", "trunk_best5.pth"):
        ...     open(os.path.join(folder, name), "wb").close()
        >>> latest_version(folder), latest_version(folder, best=True)
        ((12, 12), (5, 'best5'))
    """
    import glob

    pattern = _BEST_EPOCH if best else _EPOCH
    names = glob.glob(os.path.join(glob.escape(folder), string_to_glob))
    epochs = [int(match.group(1)) for match in map(pattern.search, names) if match]
    if not epochs:
        return 0, None
    epoch = max(epochs)
    return epoch, (f"best{epoch}" if best else epoch)


def save_dict_of_models(
    input_dict: Mapping[str, Any], suffix: Any, folder: str, **kwargs: Any
) -> None:
    """Save each model as ``folder/<name>_<suffix>.pth`` (see :func:`save_model`).

    Keyword options as in 2.x: ``log_if_successful`` logs each file at INFO level and
    ``assert_success`` re-raises an ``OSError`` after logging it (else it is only logged).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_dict_of_models({"trunk": torch.nn.Linear(2, 2)}, 4, folder)
        >>> os.listdir(folder)
        ['trunk_4.pth']
    """
    _for_each_model(input_dict, suffix, folder, save_model, "SAVE", **kwargs)


def load_dict_of_models(
    input_dict: Mapping[str, Any], suffix: Any, folder: str, device: Any, **kwargs: Any
) -> None:
    """Load ``folder/<name>_<suffix>.pth`` into each model (see :func:`load_model`).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> save_dict_of_models({"trunk": source}, 4, folder)
        >>> load_dict_of_models({"trunk": target}, 4, folder, "cpu")
        >>> bool(torch.equal(source.bias, target.bias))
        True
    """

    def load(model: Any, path: str) -> None:
        load_model(model, path, device)

    _for_each_model(input_dict, suffix, folder, load, "LOAD", **kwargs)


def delete_dict_of_models(
    input_dict: Mapping[str, Any], suffix: Any, folder: str, **kwargs: Any
) -> None:
    """Delete ``folder/<name>_<suffix>.pth`` for each name; missing files are fine.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> save_dict_of_models({"trunk": torch.nn.Linear(2, 2)}, 4, folder)
        >>> delete_dict_of_models({"trunk": None}, 4, folder)
        >>> os.listdir(folder)
        []
    """
    _for_each_model(input_dict, suffix, folder, _delete_file, "DELETE", **kwargs)


def _delete_file(_: Any, path: str) -> None:
    if os.path.isfile(path):  # never a folder
        os.remove(path)


def operate_on_dict_of_models(
    input_dict: Mapping[str, Any],
    suffix: Any,
    folder: str,
    operation: Callable[[Any, str], None],
    logging_string: str = "",
    log_if_successful: bool = False,
    assert_success: bool = False,
) -> None:
    """Call ``operation(model, "folder/<name>_<suffix>.pth")`` for each model, as 2.x did.

    An ``OSError`` is logged (and re-raised with ``assert_success``); ``log_if_successful``
    logs each path done, prefixed with ``logging_string``.

    Example:
        >>> seen = []
        >>> operate_on_dict_of_models({"trunk": None}, 3, "models", lambda m, p: seen.append(p))
        >>> seen == [os.path.join("models", "trunk_3.pth")]
        True
    """
    _for_each_model(
        input_dict,
        suffix,
        folder,
        operation,
        logging_string,
        log_if_successful=log_if_successful,
        assert_success=assert_success,
    )


def _for_each_model(
    input_dict: Mapping[str, Any],
    suffix: Any,
    folder: str,
    operation: Callable[[Any, str], None],
    action: str,
    log_if_successful: bool = False,
    assert_success: bool = False,
) -> None:
    for name, model in input_dict.items():
        path = modelpath_creator(folder, name, suffix)
        try:
            operation(model, path)
        except OSError:
            logger.warning("Could not %s %s", action, path)
            if assert_success:
                raise
            continue
        if log_if_successful:
            logger.info("%s %s", action, path)
