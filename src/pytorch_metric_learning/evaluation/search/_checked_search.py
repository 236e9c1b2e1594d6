"""The one place every search the library makes through a k-NN backend passes.

``AccuracyCalculator``, the testers (through it), ``InferenceModel``, ``pml-eval`` and
:func:`~pytorch_metric_learning.evaluation.check_knn_backend` call a backend through
:func:`search_knn`, which:

1. fingerprints the query and reference (version counters, plain and column-weighted row
   sums) and raises when
   the backend changed them in place;
2. wraps any exception the backend raises in :class:`BackendRuntimeError` naming the
   backend and its distribution (the original is chained; the library's own errors pass);
3. checks the answer's form (:func:`~.knn_output.check_knn_output`) and content
   (:func:`~._spot_check.spot_check_knn`), and warns with the measured recall for an
   approximate backend whose neighbours differ from the exact ones.

The built-in exact :class:`~.knn.CustomKNN` (not a subclass) skips the checks of 1 and 3:
its own tests prove its answers, and the checks' passes over the inputs and outputs cost
a quarter of a blocked search's time at k = 2,000 (each block and reference chunk is a
search of its own).
"""

from __future__ import annotations

from importlib.metadata import packages_distributions
from typing import Any

import torch

from ..._mapped import row_blocks
from ..._warnings import warn_external
from ...errors import BackendOutputError, BackendRuntimeError, PMLError
from ._spot_check import QUERY_SAMPLE, SpotCheck, diagnose_output, spot_check_knn
from .knn import CustomKNN
from .knn_output import _describe_backend, _provenance, check_knn_output
from .registry import configured_distance

__all__ = ["ApproximateSearchWarning", "search_knn", "input_fingerprint", "version_counter"]


class ApproximateSearchWarning(UserWarning):
    """An approximate k-NN backend's neighbours differ from the exact ones: the metrics
    are those of its recall, which the message gives."""


def input_fingerprint(*tensors: torch.Tensor | None) -> list[Any]:
    """A cheap fingerprint of tensors: version counter, storage, plain and weighted row sums.

    The version counter sees torch's in-place operations; the row sums (O(size), in the
    tensor's dtype, in blocks of rows) see writes through a shared NumPy view too, values
    moved within a row, and a reordering of the rows. One tensor passed twice (a self-search) is summed once.
    An inference tensor (made under ``torch.inference_mode()``, as Lightning's validation
    loop makes them) has no version counter: its row sums alone stand for it.
    """
    prints: list[Any] = []
    seen: list[torch.Tensor] = []
    for tensor in tensors:
        if tensor is None or any(tensor is other for other in seen):
            continue
        seen.append(tensor)
        sums = _row_sums(tensor.detach()) if tensor.ndim == 2 else None
        prints.append((version_counter(tensor), tensor.data_ptr(), tuple(tensor.shape), sums))
    return prints


def version_counter(tensor: torch.Tensor) -> int | None:
    """``tensor._version``, or ``None`` for an inference tensor, which has none (reading it
    raises ``RuntimeError: Inference tensors do not track version counter``).

    Example:
        >>> with torch.inference_mode():
        ...     made_in_inference_mode = torch.zeros(2)
        >>> version_counter(torch.zeros(2)), version_counter(made_in_inference_mode)
        (0, None)
    """
    return None if tensor.is_inference() else tensor._version


def _row_sums(matrix: torch.Tensor) -> torch.Tensor:
    """Each row's plain sum and its sum with distinct weights per column: the second sees
    values moved within a row (a swap keeps the plain sum)."""
    if not matrix.is_floating_point():
        return torch.cat([block.sum(dim=1) for block in row_blocks(matrix)])
    steps = torch.arange(matrix.shape[1], dtype=torch.float64) * 0.6180339887498949
    weights = steps.frac().add(1.0).to(device=matrix.device, dtype=matrix.dtype)
    plain, weighted = [], []
    for rows in row_blocks(matrix):  # a mapped file block by block, released after each
        plain.append(rows.sum(dim=1))
        weighted += [(block * weights).sum(dim=1) for block in rows.split(_FINGERPRINT_ROWS)]
    return torch.stack([torch.cat(plain), torch.cat(weighted)])


# Rows weighted at a time: the temporary product stays small (a few MiB) for any input.
_FINGERPRINT_ROWS = 8192


def _same(before: list[Any], after: list[Any]) -> bool:
    for old, new in zip(before, after):
        if old[:3] != new[:3]:
            return False
        if old[3] is not None and not torch.equal(old[3], new[3]):
            return False
    return True


def search_knn(
    knn_func: Any, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
    ref_includes_query: bool = False,
    *, caller: str | None = None, backend: Any = None, queries: int = QUERY_SAMPLE,
) -> tuple[tuple[torch.Tensor, torch.Tensor], SpotCheck | None]:  # fmt: skip
    """Call a k-NN backend and check its answer for form and truth.

    Args:
        knn_func: The backend.
        query: The query.
        k: Neighbours per query.
        reference: The reference (``None``: the query itself).
        ref_includes_query: Whether the query is the first rows of the reference.
        caller: Who searches, for messages (``"AccuracyCalculator"``).
        backend: How messages name the backend (default: ``knn_func``).
        queries: How many queries the spot-check scans exactly.

    Returns:
        ``((distances, indices), check)``: the backend's answer and what the spot-check
        measured (``None`` for the built-in exact ``CustomKNN``, proven by its tests).

    Raises:
        BackendRuntimeError: the backend raised (the original is chained).
        BackendOutputError: the answer breaks the contract, is not the truth, or the
            backend modified its inputs.

    Example:
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> from pytorch_metric_learning.evaluation import CustomKNN
        >>> exact = CustomKNN(LpDistance(normalize_embeddings=False))
        >>> def knn(query, k, reference=None, ref_includes_query=False):
        ...     return exact(query, k, reference, ref_includes_query)
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> (distances, indices), check = search_knn(knn, x, 1, x, True)
        >>> indices.tolist(), check.exact, check.recall
        ([[1], [0], [1]], True, 1.0)
    """
    backend = knn_func if backend is None else backend
    name = _describe_backend(backend)
    if caller:
        name = f"knn_func of {caller} ({name})"
    if type(knn_func) is CustomKNN:  # the built-in exact search, proven by its tests
        with torch.no_grad():
            return _call(knn_func, query, k, reference, ref_includes_query, backend, name), None
    before = input_fingerprint(query, reference)
    with torch.no_grad():
        output = _call(knn_func, query, k, reference, ref_includes_query, backend, name)
    if not _same(before, input_fingerprint(query, reference)):
        raise BackendOutputError(
            f"The {name} modified its inputs: the query or reference changed during the "
            "search (in place, e.g. normalized or sorted). A backend must copy what it "
            "changes; the caller's embeddings are now altered."
            f"{_provenance(backend)}"
        )
    try:
        distances, indices = check_knn_output(
            output,
            query,
            k,
            reference,
            ref_includes_query,
            backend=backend,
            caller=caller,
            knn_func=knn_func,
        )
    except BackendOutputError as error:
        hint = diagnose_output(output, query, reference, configured_distance(knn_func))
        if not hint:
            raise
        raise type(error)(f"{error} {hint}") from None
    try:
        check = spot_check_knn(
            distances,
            indices,
            query,
            k,
            reference,
            ref_includes_query,
            distance=configured_distance(knn_func),
            backend=knn_func,
            name=name,
            queries=queries,
        )
    except BackendOutputError as error:
        raise BackendOutputError(f"{error}{_provenance(backend)}") from None
    if not check.exact and check.recall is not None and check.recall < 1.0:
        warn_external(
            f"The {name} is an approximate index: its neighbours differ from the exact ones "
            f"(recall@{k} {check.recall:.4f} on {check.queries} sampled queries), so the "
            "metrics are those of an approximate search.",
            ApproximateSearchWarning,
        )
    return (distances, indices), check


def _call(
    knn_func: Any, query: torch.Tensor, k: int, reference: torch.Tensor | None,
    ref_includes_query: bool, backend: Any, name: str,
) -> Any:  # fmt: skip
    try:
        return knn_func(query, k, reference, ref_includes_query)
    except PMLError:  # the library's own diagnosis (bad input, a backend error already named)
        raise
    except (Exception, SystemExit) as error:  # a backend must not end the program either
        raise BackendRuntimeError(
            f"The {name} failed during a search ({type(error).__name__}: "
            f"{' '.join(str(error).split())}). This is a failure of the backend, not of "
            f"your input or of the library.{_provenance(backend) or _module_origin(knn_func)}"
        ) from error


def _module_origin(knn_func: Any) -> str:
    """For a backend not built by name: the distribution its class's module belongs to."""
    module = (getattr(knn_func, "__module__", None) or type(knn_func).__module__ or "").split(".")[
        0
    ]
    try:
        owners = packages_distributions().get(module, [])
    except Exception:  # broken metadata must not hide the backend's own error
        owners = []
    return f" It comes from the distribution {owners[0]}." if owners else ""
