"""Check a k-NN backend's answer for truth: recompute a small fixed sample of it exactly.

The form checks of :mod:`.knn_output` see shapes, dtypes and order; a backend can pass them
and still return the wrong neighbours (similarities least-similar first, indices into a
sorted copy of the reference, the wrong metric, an approximate index that does not say so).
This spot-check recomputes, with the distance object the backend was configured with:

- the values of :data:`PAIR_SAMPLE` returned ``(query, neighbour)`` pairs spread over all
  queries, which must equal the values the backend returned (within float rounding);
- an exact scan of :data:`QUERY_SAMPLE` queries spread over the query: their returned
  neighbours must be the ``k`` nearest (ties in either order) and listed nearest first.

Its cost is ``QUERY_SAMPLE * len(reference)`` distances, ``QUERY_SAMPLE / len(query)`` of a
brute-force search (0.04% at 20,000 queries; ``docs/benchmarks.md`` has the measurements).
An approximate backend (``is_exact = False``) gets its recall on the scanned queries
instead of an error when its neighbours differ; wrong values for the pairs it returned
are still an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ...distances import (
    BaseDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
)
from ...errors import BackendOutputError

__all__ = [
    "PAIR_SAMPLE",
    "QUERY_SAMPLE",
    "SpotCheck",
    "diagnose_output",
    "knn_is_exact",
    "spot_check_knn",
]

logger = logging.getLogger(__name__)

PAIR_SAMPLE = 256  # returned (query, neighbour) pairs whose values are recomputed
QUERY_SAMPLE = 8  # queries scanned exactly against the whole reference


class _CosineDistance(BaseDistance):
    """``1 - cosine similarity`` as a distance (smallest first): hnswlib's and usearch's
    cosine space, which plugins often return as is."""

    def __init__(self) -> None:
        super().__init__(normalize_embeddings=True, is_inverted=False)

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return 1 - query @ ref.T

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 1 - (x * y).sum(dim=1)


# Distances a mismatch is compared with, to say which metric the backend used instead.
_CANDIDATES: dict[str, BaseDistance] = {
    "euclidean": LpDistance(normalize_embeddings=False),
    "squared euclidean": LpDistance(normalize_embeddings=False, power=2),
    "cosine similarity": CosineSimilarity(),
    "dot product": DotProductSimilarity(normalize_embeddings=False),
    "cosine distance (1 - cosine similarity)": _CosineDistance(),
    "euclidean of normalized rows": LpDistance(normalize_embeddings=True),
    "squared euclidean of normalized rows": LpDistance(normalize_embeddings=True, power=2),
}


@dataclass(frozen=True)
class SpotCheck:
    """What the spot-check of one search measured.

    Attributes:
        exact: Whether the backend declares exact results (``is_exact``, default True).
        recall: Fraction of the scanned queries' true ``k`` nearest neighbours (ties count
            as found) that the backend returned; ``None`` when nothing was scanned.
        queries: How many queries were scanned exactly.
        k: The ``k`` of the search.
        distance: The distance object's repr the values were recomputed with, or ``""``
            when the backend's distance is unknown and nothing was recomputed.
    """

    exact: bool
    recall: float | None
    queries: int
    k: int
    distance: str

    def describe(self) -> str:
        """One sentence for logs and the CLI: whether the figures come from an approximate index.

        Example:
            >>> SpotCheck(False, 0.975, 8, 10, "LpDistance()").describe()
            'approximate k-NN index (is_exact = False): recall@10 0.9750 measured on 8 sampled queries'
        """
        kind = "exact k-NN search" if self.exact else "approximate k-NN index (is_exact = False)"
        if self.recall is None:
            return f"{kind}: recall not measured"
        return (
            f"{kind}: recall@{self.k} {self.recall:.4f} measured on {self.queries} sampled queries"
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return {
            "exact": self.exact,
            "recall": self.recall,
            "sampled_queries": self.queries,
            "k": self.k,
            "distance": self.distance,
        }


def knn_is_exact(knn_func: Any) -> bool:
    """Whether a k-NN backend promises the exact ``k`` nearest neighbours.

    A bool ``is_exact`` attribute of the backend; True when it has none (the contract's
    default). An approximate index declares ``is_exact = False``.

    Example:
        >>> knn_is_exact(len)
        True
    """
    declared = getattr(knn_func, "is_exact", None)
    return declared if isinstance(declared, bool) else True


def spot_check_knn(
    distances: torch.Tensor,
    indices: torch.Tensor,
    query: torch.Tensor,
    k: int,
    reference: torch.Tensor | None,
    ref_includes_query: bool,
    *,
    distance: BaseDistance | None,
    backend: Any,
    name: str,
    queries: int = QUERY_SAMPLE,
) -> SpotCheck:
    """Recompute a fixed sample of a form-checked answer; raise when it is not the truth.

    Args:
        distances: The backend's distances (already through the form checks).
        indices: The backend's indices.
        query: The query of the call.
        k: The ``k`` of the call.
        reference: The reference of the call (``None``: the query).
        ref_includes_query: The ``ref_includes_query`` of the call.
        distance: The distance the backend was configured with (``None``: unknown, so
            only the pairs of a known metric that match are used, see below).
        backend: The backend (its ``is_exact`` and ``is_inverted`` are read).
        name: How messages name the backend.
        queries: How many queries to scan exactly.

    Returns:
        The measured :class:`SpotCheck`.

    Raises:
        BackendOutputError: naming the backend, the first offending pair and the mistake
            it looks like (ascending similarities, wrong metric, indices of another
            ordering, an undeclared approximate index).
    """
    reference = query if reference is None else reference
    exact = knn_is_exact(backend)
    if k == 0 or not len(query):
        return SpotCheck(exact, None, 0, k, "")
    if distance is None:
        distance = _infer_distance(distances, indices, query, reference)
        if distance is None:
            logger.info("%s: no distance object known, so no spot-check of its values", name)
            return SpotCheck(exact, None, 0, k, "")
    with torch.no_grad():
        _check_pairs(distances, indices, query, reference, distance, name)
        try:
            recall, rows = _scan(
                distances, indices, query, k, reference, ref_includes_query, distance, name, queries
            )
        except _NeighbourMiss as miss:
            if exact:
                raise
            recall, rows = miss.recall, miss.queries
    check = SpotCheck(exact, recall, rows, k, repr(distance))
    if not exact:
        logger.info("%s: %s", name, check.describe())
    return check


def diagnose_output(
    output: Any,
    query: torch.Tensor,
    reference: torch.Tensor | None,
    distance: BaseDistance | None,
) -> str:
    """For an answer that failed a form check: which content mistake it looks like, or ``""``.

    A self-search whose indices address a sorted copy of the reference lists a query's
    own row by accident: the form check sees that, this names the cause.
    """
    reference = query if reference is None else reference
    try:
        distances, indices = output
        usable = (
            distance is not None
            and indices.dtype == torch.long
            and distances.is_floating_point()
            and indices.shape == distances.shape
            and indices.ndim == 2
            and indices.numel() > 0
            and int(indices.min()) >= 0
            and int(indices.max()) < len(reference)
            and not bool(distances.isnan().any())
        )
    except Exception:  # not even two tensors: the form check's message says it all
        return ""
    if not usable or distance is None:
        return ""
    rows, columns = _sample_pairs(indices)
    found = indices[rows, columns]
    returned = distances[rows, columns].double()
    truth = _pair_values(distance, query, reference, rows, found)
    if _close(truth, returned, query, reference, rows, found, distance):
        return ""
    return _diagnose_values(distances, indices, query, reference, distance, rows, returned)


def _matrix(distance: BaseDistance, query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``distance(query, reference)`` in float64, without re-validating the whole reference.

    The caller's inputs were checked before the search (and fingerprinted around it);
    ``distance(...)`` would scan all of them again for non-finite values, which is most of
    the spot-check's cost at scale.
    """
    if type(distance).__call__ is not BaseDistance.__call__:  # a distance of its own making
        return distance(query, reference).double()
    work = torch.promote_types(query.dtype, reference.dtype)
    work = work if work in (torch.float32, torch.float64) else torch.float32
    prepared = [distance.maybe_normalize(x.to(work)) for x in (query, reference)]
    return distance.powered_mat(*prepared).double()


def _spread(count: int, total: int, device: torch.device) -> torch.Tensor:
    """``count`` fixed positions spread evenly over ``range(total)`` (distinct when possible)."""
    count = min(count, total)
    return torch.linspace(0, total - 1, count, device=device).round().long().unique()


def _tolerance(*dtypes: torch.dtype) -> float:
    eps = max(torch.finfo(dtype).eps for dtype in dtypes)
    return max(1e-4, 64 * eps)


def _pair_scale(a: torch.Tensor, b: torch.Tensor, distance: BaseDistance) -> torch.Tensor:
    """The magnitude float rounding of a pair's value scales with (``|a|^2 + |b|^2 - 2ab``)."""
    if getattr(distance, "normalize_embeddings", False):
        return torch.full((len(a),), 4.0, dtype=torch.float64, device=a.device)
    norms = a.double().norm(dim=1) + b.double().norm(dim=1)
    return norms.square() + 1.0


def _sample_pairs(
    indices: torch.Tensor, count: int = PAIR_SAMPLE
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _spread(count, len(indices), indices.device)
    if len(rows) < count:  # few queries: several columns of each
        rows = rows.repeat_interleave(-(-count // len(rows)))[:count]
    columns = torch.arange(len(rows), device=indices.device) % indices.shape[1]
    return rows, columns


def _pair_values(
    distance: BaseDistance,
    query: torch.Tensor,
    reference: torch.Tensor,
    rows: torch.Tensor,
    found: torch.Tensor,
) -> torch.Tensor:
    values = distance.pairwise(query[rows], reference[found]).double()
    return values


def _check_pairs(
    distances: torch.Tensor,
    indices: torch.Tensor,
    query: torch.Tensor,
    reference: torch.Tensor,
    distance: BaseDistance,
    name: str,
) -> None:
    rows, columns = _sample_pairs(indices)
    found = indices[rows, columns]
    returned = distances[rows, columns].double()
    truth = _pair_values(distance, query, reference, rows, found)
    scale = _pair_scale(query[rows], reference[found], distance)
    limit = _tolerance(query.dtype, distances.dtype) * (scale + truth.abs() + returned.abs())
    wrong = ((returned - truth).abs() > limit).nonzero()
    if not len(wrong):
        return
    first = int(wrong[0])
    row, column = int(rows[first]), int(columns[first])
    pair = (
        f"query row {row}, neighbour {column} (reference row {int(found[first])}): returned "
        f"{float(returned[first]):.6g}, recomputed {float(truth[first]):.6g} with {distance!r}"
    )
    raise BackendOutputError(
        f"The {name} returned distances that are not those of its neighbours under the "
        f"configured distance: {len(wrong)} of {len(rows)} sampled pairs differ; the first is "
        f"{pair}. "
        + _diagnose_values(distances, indices, query, reference, distance, rows, returned)
    )


def _diagnose_values(
    distances: torch.Tensor,
    indices: torch.Tensor,
    query: torch.Tensor,
    reference: torch.Tensor,
    distance: BaseDistance,
    rows: torch.Tensor,
    returned: torch.Tensor,
) -> str:
    """Which mistake a value mismatch looks like."""
    found = indices[rows, torch.arange(len(rows), device=rows.device) % indices.shape[1]]
    for label, other in _CANDIDATES.items():
        values = _pair_values(other, query, reference, rows, found)
        if _close(values, returned, query, reference, rows, found, other):
            return (
                f"This looks like the wrong metric: the values are the {label} of each pair, "
                f"but the backend was configured with {distance!r}. Search and return values "
                "with the distance object the backend is given (its 'distance' option)."
            )
    if _rows_hold_true_values(distances, query, reference, distance):
        return (
            "This looks like indices of another ordering: each row holds the right distances, "
            "but its indices do not point at the rows that have them (indices into a sorted, "
            "shuffled or filtered copy of the reference?). Return positions in the reference "
            "exactly as it was passed."
        )
    return (
        "The indices do not address the rows the distances belong to, or the values are of "
        "an unknown metric."
    )


def _close(
    values: torch.Tensor,
    returned: torch.Tensor,
    query: torch.Tensor,
    reference: torch.Tensor,
    rows: torch.Tensor,
    found: torch.Tensor,
    distance: BaseDistance,
) -> bool:
    scale = _pair_scale(query[rows], reference[found], distance)
    limit = _tolerance(query.dtype) * (scale + values.abs() + returned.abs())
    return bool(((values - returned).abs() <= limit).all())


def _rows_hold_true_values(
    distances: torch.Tensor, query: torch.Tensor, reference: torch.Tensor, distance: BaseDistance
) -> bool:
    """Whether a few rows' values are the k best values of the query (any indices)."""
    rows = _spread(QUERY_SAMPLE, len(query), query.device)
    full = _matrix(distance, query[rows], reference)
    k = distances.shape[1]
    best = full.topk(min(k + 1, full.shape[1]), dim=1, largest=distance.is_inverted).values
    returned = distances[rows].double()
    limit = _tolerance(query.dtype) * (full.abs().amax(dim=1, keepdim=True) + 1.0)
    # a self-search drops each query's own value: compare with the best or the best but one
    for start in (0, 1):
        window = best[:, start : start + k]
        if window.shape == returned.shape and bool(((window - returned).abs() <= limit).all()):
            return True
    return False


def _infer_distance(
    distances: torch.Tensor, indices: torch.Tensor, query: torch.Tensor, reference: torch.Tensor
) -> BaseDistance | None:
    """The known metric whose values the backend returned, for a backend that names none."""
    rows, columns = _sample_pairs(indices)
    found = indices[rows, columns]
    returned = distances[rows, columns].double()
    for other in _CANDIDATES.values():
        values = _pair_values(other, query, reference, rows, found)
        if _close(values, returned, query, reference, rows, found, other):
            return other
    return None


def _scan(
    distances: torch.Tensor,
    indices: torch.Tensor,
    query: torch.Tensor,
    k: int,
    reference: torch.Tensor,
    ref_includes_query: bool,
    distance: BaseDistance,
    name: str,
    queries: int,
) -> tuple[float, int]:
    """Exact search of a few queries; return the recall, raise for an exact backend's miss."""
    rows = _spread(queries, len(query), query.device)
    full = _matrix(distance, query[rows], reference)
    key = -full if distance.is_inverted else full  # smaller is nearer
    limit = _tolerance(query.dtype, distances.dtype) * (key.abs().amax(dim=1, keepdim=True) + 1.0)
    if ref_includes_query:
        key[torch.arange(len(rows), device=key.device), rows] = float("inf")
    truth = key.topk(k, dim=1, largest=False).values  # the k nearest, nearest first
    got = key.gather(1, indices[rows])
    kth = truth[:, -1:]
    hits = (got <= kth + limit).double().mean(dim=1)
    recall = float(hits.mean())
    _check_listing_order(got, limit, rows, indices, distance, name)
    misses = (got.sort(dim=1).values - truth).abs() > limit
    bad = misses.any(dim=1).nonzero()
    if len(bad):
        row = int(bad[0])
        message = _miss_message(key, got, truth, limit, rows, row, indices, distance, name, recall)
        raise _NeighbourMiss(message, recall, len(rows))
    return recall, len(rows)


def _check_listing_order(
    got: torch.Tensor,
    limit: torch.Tensor,
    rows: torch.Tensor,
    indices: torch.Tensor,
    distance: BaseDistance,
    name: str,
) -> None:
    """The true values of each returned row must grow (nearest first), ties aside."""
    step = got[:, :-1] - got[:, 1:]
    bad = (step > limit).any(dim=1).nonzero()
    if not len(bad):
        return
    row = int(bad[0])
    reversed_row = bool((got[row, 1:] - got[row, :-1] <= limit[row]).all())
    what = (
        "This looks like ascending similarities: the row is listed least similar first"
        if reversed_row
        else "The row is not listed nearest first"
    )
    raise BackendOutputError(
        f"The {name} returned query row {int(rows[row])}'s neighbours "
        f"{indices[rows[row]].tolist()[:8]} in the wrong order under {distance!r}. {what}; "
        "a backend that returns similarities must list them largest first and declare "
        "is_inverted = True (or keep its 'distance' object, whose is_inverted is read)."
    )


class _NeighbourMiss(BackendOutputError):
    """A scanned query's true neighbours are missing; approximate backends catch it."""

    def __init__(self, message: str, recall: float, queries: int) -> None:
        super().__init__(message)
        self.recall = recall
        self.queries = queries


def _miss_message(
    key: torch.Tensor,
    got: torch.Tensor,
    truth: torch.Tensor,
    limit: torch.Tensor,
    rows: torch.Tensor,
    row: int,
    indices: torch.Tensor,
    distance: BaseDistance,
    name: str,
    recall: float,
) -> str:
    query_row = int(rows[row])
    returned = set(indices[query_row].tolist())
    nearer = (key[row] < got[row].max() - limit[row]).nonzero().flatten().tolist()
    missing = [i for i in nearer if i not in returned]
    first = (
        f"reference row {missing[0]} (value {_value(key, row, missing[0], distance):.6g}) is "
        f"nearer than the k-th returned neighbour (value {_signed(got[row].max(), distance):.6g})"
        if missing
        else "its neighbours differ from the exact ones"
    )
    farthest = key[row].topk(got.shape[1], largest=True).values
    farthest = farthest[farthest.isfinite()]
    if len(farthest) == got.shape[1] and bool(
        ((got[row].sort().values - farthest.sort().values).abs() <= limit[row]).all()
    ):
        looks = (
            "This looks like ascending similarities: the backend returned the k least similar "
            "rows. A backend that returns similarities must list them largest first and "
            "declare is_inverted = True."
        )
    else:
        looks = (
            f"Recall on {len(rows)} sampled queries is {recall:.4f}. If the backend is an "
            "approximate index, declare is_exact = False (it then gets this recall in a "
            "warning instead of an error); else it searches the wrong metric or rows."
        )
    return (
        f"The {name} did not return the k nearest neighbours under {distance!r} for query "
        f"row {query_row}: {first}. {looks}"
    )


def _value(key: torch.Tensor, row: int, column: int, distance: BaseDistance) -> float:
    return _signed(key[row, column], distance)


def _signed(value: torch.Tensor, distance: BaseDistance) -> float:
    return float(-value if distance.is_inverted else value)
