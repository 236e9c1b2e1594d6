"""AccuracyCalculator's input checks beyond type and shape: device, NaN labels, no rows or
columns, and tensors that hold no plain values (meta, sparse, complex)."""

from __future__ import annotations

from typing import Any

import torch

from ..._validation import check_plain_tensor, invalid
from ...errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "check_device",
    "check_has_columns",
    "check_has_rows",
    "check_labels_not_nan",
    "check_plain_tensor",
]

_DEVICE = "None, a torch.device, a CUDA ordinal or a device string such as 'cpu' or 'cuda:0'"


def check_device(device: Any, owner: str) -> torch.device | None:
    """Return ``device`` as a ``torch.device`` if this machine can compute on it."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise invalid("device", owner, _DEVICE, device, InvalidTypeError)
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        if not isinstance(device, int) or device < 0:
            raise invalid("device", owner, _DEVICE, device) from None
        parsed = torch.device("cuda", device)  # an ordinal without an accelerator
    reason = _unusable(parsed)
    if reason:
        raise InvalidArgumentError(
            f"The 'device' parameter of {owner} must be a device this machine can compute "
            f"on. Got {device!r} instead: {reason}."
        )
    return parsed


def _unusable(device: torch.device) -> str:
    if device.type == "meta":
        return "the meta device holds no values to compute metrics from"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available (a CPU-only PyTorch build, or no GPU driver)"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"there are {torch.cuda.device_count()} CUDA devices"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine"
    return ""


def check_has_rows(query: torch.Tensor, reference: torch.Tensor, owner: str) -> None:
    """Raise ``ValueError`` for a query or reference without rows: nothing to evaluate."""
    for param, embeddings in (("query", query), ("reference", reference)):
        if len(embeddings) == 0:
            shape = f"shape {tuple(embeddings.shape)}"
            raise invalid(param, owner, "embeddings with at least one row", shape)


def check_labels_not_nan(labels: torch.Tensor, param: str, owner: str) -> torch.Tensor:
    """Raise ``ValueError`` when float labels hold NaN (NaN equals no label, itself included)."""
    if labels.is_floating_point() and bool(labels.isnan().any()):
        count = int(labels.isnan().sum())
        raise InvalidArgumentError(
            f"The '{param}' parameter of {owner} contains {count} NaN labels; a NaN label "
            "matches no label, itself included. Drop those samples or give them a real label."
        )
    return labels


def check_has_columns(query: torch.Tensor, owner: str) -> None:
    """Raise ``ValueError`` for embeddings of zero columns: every distance is 0, so the
    neighbours would be picked by tie order alone."""
    if query.ndim == 2 and query.shape[1] == 0:
        shape = f"shape {tuple(query.shape)}"
        raise invalid("query", owner, "embeddings with at least one column", shape)
