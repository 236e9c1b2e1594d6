"""Check that a k-NN backend's answer follows the contract of :class:`KNNFunc`.

Every check is O(len(query) * k), but the one for a neighbour listed twice, which sorts each
row (O(len(query) * k log k); about 0.2 s for 100,000 rows of k = 100 on one CPU core):
cheap next to the search itself, so ``AccuracyCalculator`` runs them on every call, and
plugin authors run them in their tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...errors import (
    BackendOutputError,
    BackendOutputTypeError,
    InvalidArgumentError,
    InvalidBackendOptionError,
)
from .protocols import knn_is_inverted
from .registry import backend_name, knn_backend_origin, load_knn_func

__all__ = ["check_knn_output", "check_knn_backend"]

CHECK_SIZE = 2000  # check_knn_backend's default reference rows
_SMALL = 64  # rows of its self-search with k = n - 1, and the least size it takes
_DIMS = 16
_DISTANCE_KINDS = ("euclidean", "cosine")

_CONTRACT = "see the KNNFunc contract in pytorch_metric_learning.evaluation.search.protocols"


def _describe_backend(backend: Any) -> str:
    """How error messages name a backend: its registry name and class, or its class alone.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> _describe_backend(load_knn_func("custom")), _describe_backend("toy")
        ("k-NN backend 'custom' (CustomKNN)", "k-NN backend 'toy'")
    """
    if isinstance(backend, str):
        return f"k-NN backend {backend!r}"
    kind = getattr(backend, "__qualname__", None) or type(backend).__qualname__
    name = backend_name(backend)
    return f"k-NN backend {name!r} ({kind})" if name else f"k-NN backend {kind}"


def _provenance(backend: Any) -> str:
    """Where a backend built by name comes from, as a sentence to end a message with.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> _provenance(load_knn_func("custom")), _provenance("toy")
        (" Backend 'custom' comes from the distribution pytorch-metric-learning.", '')
    """
    origin = knn_backend_origin(backend)
    if not origin:
        return ""
    name = backend_name(backend)
    if origin.startswith("registered"):
        return f" Backend {name!r} is {origin}."
    return f" Backend {name!r} comes from the distribution {origin}."


def check_knn_output(
    output: Any, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
    ref_includes_query: bool = False,
    *, backend: Any = None, caller: str | None = None, knn_func: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Return a k-NN backend's ``(distances, indices)`` if they follow the contract.

    Checks types and dtypes, the ``(len(query), k)`` shape, the query's device, indices
    inside the reference (no -1 padding), distinct within each row, no query's own row in a self-search, no NaN
    distances, and rows sorted nearest first (similarities descending for a backend with
    ``is_inverted = True``; ties and float rounding are allowed). It does not check that
    the neighbours are the exact ones: approximate backends are welcome.

    Args:
        output: What the backend returned for ``(query, k, reference, ref_includes_query)``.
        query: The query of that call.
        k: The ``k`` of that call.
        reference: The reference of that call (``None``: the query itself).
        ref_includes_query: The ``ref_includes_query`` of that call.
        backend: The backend object (its ``is_inverted`` decides the order, and error
            messages name it) or a name for messages.
        caller: Who called the backend, for messages (``"AccuracyCalculator"``).
        knn_func: The backend object whose ``is_inverted`` decides the order, when
            ``backend`` only names it (default: ``backend``).

    Returns:
        ``(distances, indices)``, unchanged.

    Raises:
        BackendOutputTypeError: (a ``TypeError`` and ``ValueError``) for anything but two
            tensors, integer indices other than ``torch.long``, or non-float distances.
        BackendOutputError: (a ``ValueError``) for any other break of the contract.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.evaluation import CustomKNN
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> knn = CustomKNN(LpDistance(normalize_embeddings=False))
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> check_knn_output(knn(x, 2, x, True), x, 2, x, True, backend=knn)[1].tolist()
        [[1, 2], [0, 2], [1, 0]]
        >>> forgetful = (torch.zeros(3, 2), torch.tensor([[0, 1], [0, 2], [1, 0]]))
        >>> try:
        ...     check_knn_output(forgetful, x, 2, x, True)
        ... except ValueError as error:
        ...     print(error)
        The k-NN backend returned row 0 containing its own index 0 in a self-search ...
    """
    name = "k-NN backend" if backend is None else _describe_backend(backend)
    if caller:
        name = f"knn_func of {caller} ({name})"
    try:
        order_of = backend if knn_func is None else knn_func
        return _check_all(output, query, k, reference, ref_includes_query, order_of, name)
    except BackendOutputError as error:
        where = _provenance(backend)
        if not where:
            raise
        raise type(error)(f"{error}{where}") from None


def _check_all(
    output: Any,
    query: torch.Tensor,
    k: int,
    reference: torch.Tensor | None,
    ref_includes_query: bool,
    backend: Any,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    distances, indices = _two_tensors(output, name)
    num_reference = len(query) if reference is None else len(reference)
    _check_shape(distances, indices, (len(query), k), ref_includes_query, name)
    _check_dtypes(distances, indices, name)
    _check_device(distances, indices, query.device, name)
    _check_padding(distances, indices, k, name)
    _check_index_range(indices, num_reference, k, name)
    _check_distinct(indices, name)
    if ref_includes_query:
        _check_no_self_match(indices, name)
    inverted = backend is not None and not isinstance(backend, str) and knn_is_inverted(backend)
    _check_order(distances, inverted, name)
    return distances, indices


def check_knn_backend(knn_func: Any, *, backend: Any = None, size: int = CHECK_SIZE) -> list[Any]:
    """Run realistic searches through a k-NN backend; check every answer's form and truth.

    First the tiny searches of old (5 and 12 random rows in 3-D, a self-search with
    ``k = n - 1``), then on ``size`` clustered float32 rows of 16 dimensions (and
    ``size // 4`` separate queries): a search against a separate reference (k = 10), a
    self-search (k = 10), a self-search with ``k = n - 1`` on the first 64 rows (the most a
    self-search may ask for), and the separate search again on the backend's default
    threads, which must give the same distances and indices (determinism). Every answer goes through the form checks of
    :func:`check_knn_output` and the content spot-check of every library search (values of
    sampled pairs recomputed with the backend's distance, 32 queries scanned exactly), so
    ascending similarities, the wrong metric, indices of another ordering, an undeclared
    approximate index, modified inputs and padding are caught here, before use.

    Given a backend *name* or spec mapping, the backend is built once per distance kind
    (``distance="euclidean"`` and ``distance="cosine"``) when its factory takes a
    ``distance`` option; a built backend is checked with its own distance.

    Args:
        knn_func: The backend to try, or a name / ``{"name": ...}`` spec to build it from.
        backend: How messages name it (default: ``knn_func`` itself).
        size: Rows of the reference (at least 64); authors may test at their own scale.

    Returns:
        What each search's spot-check measured (:class:`SpotCheck`: exact or approximate,
        recall on the sampled queries).

    Raises:
        BackendOutputError: (a ``ValueError``) naming the backend and what it got wrong.
        BackendRuntimeError: (a ``RuntimeError``) the backend raised during a search.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> _ = check_knn_backend(load_knn_func("custom"), size=200)
        >>> def forgetful(query, k, reference=None, ref_includes_query=False):
        ...     return load_knn_func("custom")(query, k, reference, False)
        >>> try:
        ...     check_knn_backend(forgetful, size=200)
        ... except ValueError as error:
        ...     print(error)
        The k-NN backend forgetful returned row 0 containing its own index 0 ...
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < _SMALL:
        raise InvalidArgumentError(
            f"The 'size' parameter of check_knn_backend must be an int of at least {_SMALL}. "
            f"Got {size!r} instead."
        )
    checks: list[Any] = []
    spec = isinstance(knn_func, (str, Mapping))
    for built in _built_variants(knn_func):
        checks += _check_one(
            built, backend if backend is not None else built if spec else knn_func, size
        )
    return checks


def _built_variants(knn_func: Any) -> list[Any]:
    """The backend itself, or one build per distance kind from a name or spec mapping."""
    if not isinstance(knn_func, (str, Mapping)):
        return [knn_func]
    if isinstance(knn_func, Mapping) and "distance" in knn_func:
        return [load_knn_func(knn_func)]
    try:
        return [load_knn_func(knn_func, distance=kind) for kind in _DISTANCE_KINDS]
    except InvalidBackendOptionError:  # the factory takes no 'distance' option
        return [load_knn_func(knn_func)]


def check_data(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(query, reference)``: clustered float32 points, ``size // 4`` and ``size`` rows."""
    generator = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(20, _DIMS, generator=generator)
    rows = size + size // 4
    points = centers[torch.randint(0, 20, (rows,), generator=generator)]
    points = points + torch.randn(rows, _DIMS, generator=generator)
    return points[size:].clone(), points[:size].clone()


def _check_one(knn_func: Any, backend: Any, size: int) -> list[Any]:
    from ._checked_search import search_knn  # it imports this module's form checks

    query, reference = check_data(size)
    small = reference[:_SMALL].clone()
    tiny, tiny_reference = torch.randn(2, 12, 3, generator=torch.Generator().manual_seed(0))
    realistic = (query, 10, reference, False)
    calls = [
        (tiny[:5], 3, tiny_reference, False),  # tiny first: a broken form shows on 5 rows
        (tiny, len(tiny) - 1, tiny, True),
        realistic,
        (reference, 10, reference, True),
        (small, len(small) - 1, small, True),
    ]
    checks, answers = [], []
    for call in calls:
        answer, check = search_knn(knn_func, *call, backend=backend, queries=32)
        answers.append(answer)
        checks.append(check)
    again, _ = search_knn(knn_func, *realistic, backend=backend, queries=32)
    first = answers[2]  # the realistic separate search
    if not (torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])):
        changed = int((again[1] != first[1]).any(dim=1).sum())
        raise BackendOutputError(
            f"The {_describe_backend(backend)} returned different distances or neighbours for "
            f"the same search twice ({changed} of {len(first[1])} rows changed neighbours); "
            "the k-NN contract asks for deterministic results: seed what the backend "
            "randomizes, and build approximate indexes (HNSW) on one thread or with a "
            f"deterministic insertion order.{_provenance(backend)}"
        )
    return [check for check in checks if check is not None]


def _two_tensors(output: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        got = type(output).__name__
        if isinstance(output, (tuple, list)):
            got = f"a {got} of {len(output)} items"
        raise BackendOutputTypeError(
            f"The {name} must return a tuple (distances, indices). Got {got} instead; {_CONTRACT}."
        )
    kinds = [type(part).__module__ + "." + type(part).__name__ for part in output]
    if not all(isinstance(part, torch.Tensor) for part in output):
        hint = ""
        if any(kind.startswith("numpy.") for kind in kinds):
            hint = " Convert numpy results with torch.from_numpy(...).to(query.device)."
        raise BackendOutputTypeError(
            f"The {name} must return torch tensors (distances, indices). "
            f"Got ({', '.join(kinds)}) instead.{hint}"
        )
    return output[0], output[1]


def _check_shape(
    distances: torch.Tensor,
    indices: torch.Tensor,
    expected: tuple[int, int],
    ref_includes_query: bool,
    name: str,
) -> None:
    for part, tensor in (("distances", distances), ("indices", indices)):
        if tuple(tensor.shape) == expected:
            continue
        wide = tensor.ndim == 2 and tensor.shape[1] == expected[1] + 1
        raise BackendOutputError(
            f"The {name} must return {part} of shape {expected} (len(query), k). "
            f"Got {tuple(tensor.shape)} instead.{_width_hint(ref_includes_query) if wide else ''}"
        )


def _width_hint(ref_includes_query: bool) -> str:
    if ref_includes_query:
        return (
            " The width is k + 1: with ref_includes_query=True the backend must search "
            "k + 1 neighbours and then drop each query's own row, e.g. with "
            "pytorch_metric_learning.evaluation.remove_self_matches."
        )
    return (
        " The width is k + 1: only a self-search (ref_includes_query=True) searches one "
        "extra neighbour, to drop each query's own row; this call had "
        "ref_includes_query=False."
    )


def _check_dtypes(distances: torch.Tensor, indices: torch.Tensor, name: str) -> None:
    if indices.dtype != torch.long:
        raise BackendOutputTypeError(
            f"The {name} must return indices of dtype torch.long. Got {indices.dtype} "
            "instead; convert them with indices.long()."
        )
    if not distances.is_floating_point():
        raise BackendOutputTypeError(
            f"The {name} must return floating-point distances. Got {distances.dtype} instead."
        )


def _check_device(
    distances: torch.Tensor, indices: torch.Tensor, device: torch.device, name: str
) -> None:
    for part, tensor in (("distances", distances), ("indices", indices)):
        if tensor.device != device:
            raise BackendOutputError(
                f"The {name} must return {part} on the query's device ({device}). "
                f"Got {tensor.device} instead; move them with .to(query.device)."
            )


def _check_padding(distances: torch.Tensor, indices: torch.Tensor, k: int, name: str) -> None:
    """Name the padding of a backend that found fewer than k neighbours.

    faiss pads with index -1 (and a huge distance), pynndescent with -1 and ``inf``,
    usearch with index 0 and a NaN distance: none of them is a row of the reference.
    """
    if not indices.numel():
        return
    minus = indices == -1
    nan = distances.isnan()
    if bool(minus.any()):
        what = "-1 indices"
        style = "faiss-style padding" + (
            " (or pynndescent-style: index -1 with an inf distance)"
            if bool(distances[minus].isinf().all())
            else ""
        )
    elif bool(nan.any()):
        what = "NaN distances"
        style = (
            "usearch-style padding (index 0 with a NaN distance)"
            if bool((indices[nan] == 0).all())
            else "padding, or a failed distance computation"
        )
    else:
        return
    rows = int((minus | nan).any(dim=1).sum())
    raise BackendOutputError(
        f"The {name} returned {what} in {rows} rows: {style}, meaning the index found fewer "
        f"than k={k} neighbours for those queries (an approximate index that visits too "
        "little of itself, e.g. a low nprobe, efSearch or ef). Search more of the index, ask "
        "for fewer neighbours, or fill the missing ones by an exact search of those rows."
    )


def _check_index_range(indices: torch.Tensor, num_reference: int, k: int, name: str) -> None:
    if not indices.numel():
        return
    if bool((indices == -1).any()):
        rows = int((indices == -1).any(dim=1).sum())
        raise BackendOutputError(
            f"The {name} returned -1 indices in {rows} rows: faiss-style padding, meaning the "
            f"index found fewer than k={k} neighbours for those queries (an approximate "
            "index that visits too few cells, e.g. a low nprobe or efSearch). Search more "
            "of the index or ask for fewer neighbours."
        )
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= num_reference:
        raise BackendOutputError(
            f"The {name} returned indices outside the reference of {num_reference} rows "
            f"(range {low}..{high}); indices must address rows of the reference of the call."
        )


def _check_distinct(indices: torch.Tensor, name: str) -> None:
    if indices.shape[-1] < 2:
        return
    ordered = indices.sort(dim=1).values
    rows = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1).nonzero()
    if len(rows):
        row = int(rows[0])
        raise BackendOutputError(
            f"The {name} returned row {row} listing the same reference row more than once: "
            f"{indices[row].tolist()[:8]}. {len(rows)} rows have this problem; each row must "
            "hold k distinct neighbours, or a repeated neighbour counts twice in every metric."
        )


def _check_no_self_match(indices: torch.Tensor, name: str) -> None:
    own = torch.arange(len(indices), device=indices.device).unsqueeze(1)
    rows = (indices == own).any(dim=1).nonzero()
    if len(rows):
        row = int(rows[0])
        raise BackendOutputError(
            f"The {name} returned row {row} containing its own index {row} in a "
            f"self-search (ref_includes_query=True). {len(rows)} rows have this problem; "
            "the backend must drop each query's own row, e.g. with "
            "pytorch_metric_learning.evaluation.remove_self_matches, or every query "
            "finds itself and precision_at_1 is a meaningless 1.0."
        )


def _check_order(distances: torch.Tensor, inverted: bool, name: str) -> None:
    if not distances.numel():
        return
    if bool(distances.isnan().any()):
        raise BackendOutputError(f"The {name} returned NaN distances.")
    if distances.shape[1] < 2:
        return
    nearer, farther = distances[:, :-1], distances[:, 1:]
    if inverted:
        nearer, farther = farther, nearer
    step = nearer - farther  # > 0: out of order; inf - inf is NaN, a tie, never > 0
    if not bool((step > 0).any()):
        return
    # Rounding in a distance computed as |q|^2 + |r|^2 - 2 q.r scales with the row's
    # magnitudes, not with each (possibly tiny) distance: allow it relative to the row.
    finite = distances.nan_to_num(0.0, posinf=0.0, neginf=0.0).abs()
    scale = finite.amax(dim=1, keepdim=True)
    bad = (step > _tolerance(distances.dtype) * scale + 1e-12).any(dim=1).nonzero()
    if len(bad):
        row = int(bad[0])
        order = "similarities descending" if inverted else "distances ascending"
        raise BackendOutputError(
            f"The {name} returned rows not sorted nearest first ({order}): row {row} is "
            f"{distances[row].tolist()[:8]}. {len(bad)} rows are out of order. A backend "
            "that returns similarities must declare is_inverted = True."
        )


def _tolerance(dtype: torch.dtype) -> float:
    return max(1e-5, 8 * torch.finfo(dtype).eps)
