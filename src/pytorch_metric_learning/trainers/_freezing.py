"""Freezing parts of a model during training, with pytorch-metric-learning 2.x's semantics.

``freeze_these`` names models or losses whose parameters stop learning: their gradients are
switched off, they run in eval mode, and the optimizers named ``<name>_optimizer`` do not
step. ``freeze_trunk_batchnorm`` only puts the trunk's batch-norm layers in eval mode, so
their running statistics stop changing (their affine weights still learn).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .._validation import invalid
from ..errors import InvalidKeysError, InvalidTypeError

__all__ = ["check_freeze_these", "freeze_batchnorm", "is_frozen_optimizer", "set_train_modes"]

logger = logging.getLogger(__name__)

_OPTIMIZER_SUFFIX = "_optimizer"


def check_freeze_these(
    freeze_these: Any, allowed: Iterable[str], optimizers: Mapping[str, Any], owner: str
) -> tuple[str, ...]:
    """Return ``freeze_these`` as a tuple of names, each one of ``allowed``.

    Logs a warning, as 2.x did, for a frozen name that also has an optimizer.

    Example:
        >>> check_freeze_these(["trunk"], ["trunk", "embedder"], {}, "MetricLossOnly")
        ('trunk',)
    """
    names = sorted(set(allowed))
    expected = f"a list or tuple of names among {names}"
    if isinstance(freeze_these, str) or not isinstance(freeze_these, (list, tuple, set)):
        raise invalid("freeze_these", owner, expected, freeze_these, InvalidTypeError)
    unknown = [name for name in freeze_these if name not in names]
    if unknown:
        raise invalid("freeze_these", owner, expected, list(freeze_these), InvalidKeysError)
    for name in freeze_these:
        if name + _OPTIMIZER_SUFFIX in optimizers:
            logger.warning(
                "You have passed in an optimizer for %s, but are freezing its parameters.", name
            )
    return tuple(freeze_these)


def set_train_modes(objects: Mapping[str, Any], freeze_these: tuple[str, ...]) -> None:
    """Frozen objects: no gradients, eval mode; the others: train mode.

    Example:
        >>> import torch
        >>> models = {"trunk": torch.nn.Linear(2, 2), "embedder": torch.nn.Linear(2, 2)}
        >>> set_train_modes(models, ("trunk",))
        >>> models["trunk"].training, models["trunk"].weight.requires_grad, models["embedder"].training
        (False, False, True)
    """
    for name, obj in objects.items():
        if name in freeze_these:
            for parameter in _parameters(obj):
                parameter.requires_grad_(False)
            if hasattr(obj, "eval"):
                obj.eval()
        elif hasattr(obj, "train"):
            obj.train()


def freeze_batchnorm(model: Any) -> None:
    """Put every batch-norm layer of ``model`` (any class named ``*BatchNorm*``) in eval mode.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        >>> freeze_batchnorm(net)
        >>> net[0].training, net[1].training
        (True, False)
    """
    modules = model.modules() if hasattr(model, "modules") else ()
    for module in modules:
        if "BatchNorm" in type(module).__name__:
            module.eval()


def is_frozen_optimizer(name: str, freeze_these: tuple[str, ...]) -> bool:
    """Whether the optimizer called ``name`` belongs to a frozen object (``trunk_optimizer``).

    Example:
        >>> is_frozen_optimizer("trunk_optimizer", ("trunk",))
        True
    """
    owner = name[: -len(_OPTIMIZER_SUFFIX)] if name.endswith(_OPTIMIZER_SUFFIX) else name
    return owner in freeze_these


def _parameters(obj: Any) -> Iterable[Any]:
    parameters = getattr(obj, "parameters", None)
    return parameters() if callable(parameters) else ()
