"""Argument checks shared by the whole library, with one phrasing for every error."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ._mapped import row_blocks
from .errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "invalid",
    "check_positive_int",
    "check_tensor",
    "check_plain_tensor",
    "check_embeddings",
    "check_matrix",
    "check_finite",
    "check_same_device",
    "float_if_integer",
]


def invalid(
    param: str, owner: str, expected: str, got: Any, error: type[Exception] = InvalidArgumentError
) -> Exception:
    """Build the exception for a parameter that is not what ``owner`` expects.

    The value is shown cut to 80 characters: a 5000-digit number is named, not echoed.
    """
    return error(
        f"The '{param}' parameter of {owner} must be {expected}. Got {shown(got)} instead."
    )


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (with its length) for a message.

    Example:
        >>> shown(10**100, limit=20)
        '1000000000000000... (101 characters)'
    """
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit str limit
        return f"an int of {value.bit_length()} bits"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 4]}... ({len(text)} characters)"


def check_positive_int(value: Any, param: str, owner: str) -> int:
    """Return ``value`` as an int if it is a positive integer (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(param, owner, "a positive int", value, InvalidTypeError)
    if value < 1:
        raise invalid(param, owner, "a positive int", value)
    return int(value)


def check_tensor(value: Any, param: str, owner: str) -> torch.Tensor:
    """Return ``value`` if it is a tensor, else raise ``TypeError``."""
    if not isinstance(value, torch.Tensor):
        raise invalid(param, owner, "a torch.Tensor", type(value).__name__, InvalidTypeError)
    return value


def check_plain_tensor(value: Any, param: str, owner: str) -> Any:
    """Refuse meta, sparse and complex tensors before any work: they hold no values (meta),
    or not as the dense real rows that distances and labels need. Other values pass."""
    if not isinstance(value, torch.Tensor):
        return value
    hint = ""
    if value.is_meta:
        got = "a meta tensor (a shape with no values)"
    elif value.layout != torch.strided:
        got, hint = f"a sparse tensor ({value.layout})", " Call .to_dense() first."
    elif value.is_complex():
        got = f"a complex tensor ({value.dtype})"
    else:
        return value
    raise InvalidTypeError(
        f"The '{param}' parameter of {owner} must be a dense real tensor with values. "
        f"Got {got} instead.{hint}"
    )


def check_embeddings(value: Any, param: str, owner: str) -> torch.Tensor:
    """Check a 2-D floating-point tensor of finite values."""
    return check_finite(check_matrix(value, param, owner), param, owner)


def check_matrix(value: Any, param: str, owner: str) -> torch.Tensor:
    """Check a 2-D floating-point tensor."""
    check_tensor(value, param, owner)
    if value.ndim != 2:
        raise invalid(param, owner, "a 2-D tensor (rows, dims)", f"shape {tuple(value.shape)}")
    if not value.is_floating_point():
        raise invalid(param, owner, "a floating-point tensor", value.dtype, InvalidTypeError)
    return value


def check_finite(value: torch.Tensor, param: str, owner: str) -> torch.Tensor:
    """Raise ``ValueError`` when a tensor holds NaN or infinite values."""
    if not all(_finite(block) for block in row_blocks(value)):  # a mapped file block by block
        raise InvalidArgumentError(
            f"The '{param}' parameter of {owner} contains NaN or infinite values; "
            "embeddings must be finite (check the model's output for overflow)."
        )
    return value


def _finite(value: torch.Tensor) -> bool:
    if value.numel() == 0 or bool(torch.isfinite(value.sum())):  # one reduction, no mask
        return True
    return bool(torch.isfinite(value).all())  # the sum overflowed, or a value is not finite


def check_same_device(first: torch.Tensor, second: torch.Tensor, names: str, owner: str) -> None:
    """Raise ``ValueError`` when two tensors live on different devices."""
    if first.device != second.device:
        raise InvalidArgumentError(
            f"The {names} of {owner} must be on the same device. "
            f"Got {first.device} and {second.device} instead; move one with .to()."
        )


def float_if_integer(value: torch.Tensor) -> torch.Tensor:
    """Integer or boolean embeddings as the default float dtype, as 2.x cast them.

    Example:
        >>> float_if_integer(torch.tensor([[1, 2]]))
        tensor([[1., 2.]])
    """
    if value.is_floating_point() or value.is_complex():
        return value
    return value.to(torch.get_default_dtype())
