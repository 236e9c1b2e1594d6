"""What a call's per-query values were computed under, to tell them from another call's.

Per-query values are reused (``find_worst_queries(per_query=...)``, which the command line
uses to compute the metrics once) only where they are the values the reusing call would
compute itself. Values of another protocol (no camera rule, or single-gallery-shot
expectations where plain outcomes were meant, a random draw where the exact expectation
was meant) would rank and label the queries wrongly without any error, so each
:class:`PerQueryValues` records the arguments it came from, as short digests (labels and
group ids by their content, not by identity: the same ids as a list, an array or a tensor
are the same), and the reuser compares them with its own.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any

import numpy as np
import torch

__all__ = ["PROTOCOL_DEFAULTS", "describe_differences", "protocol_record"]

# The protocol arguments of get_accuracy and their defaults: left out means the default.
PROTOCOL_DEFAULTS: dict[str, Any] = {
    "query_groups": None,
    "reference_groups": None,
    "junk_labels": (),
    "distractor_labels": (),
    "excluded_pairs": None,
    "is_query": None,
    "is_reference": None,
    "single_gallery_shot": False,
    "single_gallery_shot_draws": None,
}


def protocol_record(
    k: Any,
    inputs: tuple[Any, Any, Any, Any, Any],
    protocol: dict[str, Any],
) -> dict[str, str]:
    """``{argument: digest}`` of a ``get_accuracy`` call: the calculator's ``k``, the
    labels and sizes of the inputs (not the embeddings' values: hashing them would cost a
    pass over the data), ``ref_includes_query`` and every protocol argument.

    Example:
        >>> a = protocol_record(None, (None, [0, 1], None, None, False), {})
        >>> b = protocol_record(None, (None, np.array([0, 1]), None, None, False), {})
        >>> a == b, describe_differences(a, {**a, "k": "3"})
        (True, 'k (none there, 3 here)')
    """
    query, query_labels, reference, reference_labels, ref_includes_query = inputs
    record = {
        "k": _digest(k),
        "query rows": _digest(None if query is None else len(query)),
        "reference rows": _digest(None if reference is None else len(reference)),
        "query_labels": _digest(query_labels),
        "reference_labels": _digest(reference_labels),
        "ref_includes_query": _digest(bool(ref_includes_query)),
    }
    for name, default in PROTOCOL_DEFAULTS.items():
        record[name] = _digest(protocol.get(name, default))
    return record


def describe_differences(there: dict[str, str], here: dict[str, str]) -> str:
    """The arguments whose digests differ, each with both digests, for a message."""
    names = [name for name in here if there.get(name) != here[name]]
    return ", ".join(f"{name} ({there.get(name)} there, {here[name]} here)" for name in names)


def _digest(value: Any) -> str:
    """A short text that is equal for equal argument values, whatever their container."""
    if value is None:
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, str):
        return repr(value)
    array = _as_array(value)
    if array is None:
        return f"a {type(value).__name__}"
    if array.size == 0:
        return "none"
    body = repr(array.tolist()) if array.dtype.kind in "OUS" else _canonical(array).tobytes()
    text = body.encode() if isinstance(body, str) else body
    sha = hashlib.sha1(text + repr(array.shape).encode()).hexdigest()[:10]
    return f"{array.size} values #{sha}"


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        return None


def _canonical(array: np.ndarray) -> np.ndarray:
    """One dtype per kind, so that int32 and int64 ids of equal values hash alike."""
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array, dtype=np.int64)
    if array.dtype.kind == "f":
        return np.ascontiguousarray(array, dtype=np.float64)
    return np.ascontiguousarray(array)
