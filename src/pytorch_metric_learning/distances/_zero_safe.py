"""Functions of a distance whose derivative is infinite at 0, with finite gradients there.

``sqrt(s)`` and ``d ** power`` (``power < 1``) have an infinite derivative at 0. Autograd
multiplies it by the incoming gradient, and when that is 0 (an entry masked out of a loss:
the diagonal of ``d(x)``, duplicate rows) the product is NaN, which then spreads to every
weight. At 0 these functions use the subgradient 0 instead, as ``torch.cdist`` and
``torch.linalg.vector_norm`` do; elsewhere values and gradients are unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["at_zero_safe", "zero_safe_power", "zero_safe_sqrt"]


def at_zero_safe(values: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn(values)``, with a zero gradient at entries that are exactly 0.

    The forward values are those of ``fn(values)`` bit for bit. When no gradient is being
    recorded, ``fn`` is applied directly (no extra memory or time).

    Example:
        >>> x = torch.tensor([0.0, 4.0], requires_grad=True)
        >>> at_zero_safe(x, torch.sqrt).sum().backward()
        >>> x.grad.tolist()
        [0.0, 0.25]
    """
    if not (torch.is_grad_enabled() and values.requires_grad):
        return fn(values)
    nonzero = values != 0
    # Entries at 0 are replaced by 1 before fn, so that fn's derivative there is finite;
    # the outer where then puts back fn(0), a constant with no gradient.
    safe = torch.where(nonzero, values, torch.ones_like(values))
    at_zero = fn(torch.zeros((), dtype=values.dtype, device=values.device))
    return torch.where(nonzero, fn(safe), at_zero)


def zero_safe_sqrt(values: torch.Tensor) -> torch.Tensor:
    """``values.sqrt()`` with a zero gradient at 0."""
    return at_zero_safe(values, torch.sqrt)


def zero_safe_power(values: torch.Tensor, power: float) -> torch.Tensor:
    """``values ** power`` with a zero gradient at 0 where the derivative there is not finite.

    Integer powers of at least 1 have a finite derivative everywhere and are applied
    directly.
    """
    if float(power).is_integer() and power >= 1:
        return values**power
    return at_zero_safe(values, lambda v: v**power)
