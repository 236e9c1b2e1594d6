"""Scores of single (query, reference) pairs, from the two rows alone, and how far a tile's
matrix product may stray from them.

A matrix product rounds a pair's score according to where the pair lies and the shape of
the product (kernels differ for thin products and at the edges of wide ones, and a
symmetric walk meets a pair from either side), so two copies of one reference could score
a rounding error apart: which copy a search kept, and in what order, then changed with k.
The searches of the one-product distances therefore only choose candidates: :func:`refine`
scores every candidate again from its pair alone (:meth:`PairScores.of`: differences or
products of the coordinates, summed, with no cancellation between large squared norms),
so that a reported distance depends on the two rows and nothing else.
:meth:`PairScores.error` bounds how far a product's score may lie from the pair's, which
says which rows could have a neighbour that the products ranked past the candidates; those
rows are searched again whole. The result is exactly the first k by (pair score, index),
on every path and at every k.
"""

from __future__ import annotations

import torch

from ...distances import BaseDistance
from ...distances.lp_distance import power_of_squared
from ._centring import centred
from ._ties import first_k_of_rows, order_ties
from .exclusion import Exclusion

__all__ = ["PairScores", "refine"]

# Elements (pairs x dimensions) of the temporaries of one block of pair scores (16 MiB of
# float32; blocks of 2**20 took 4.5 times as long where the rows are short, d = 16).
BLOCK_ELEMENTS = 2**22
# Rows searched again whole are scored whole once their references near the k-th are
# more than 1 / WIDE_WINDOW of all: listing them costs more than it saves (a self-search
# of 10,000 identical rows of 16, k = 10: 5.3 s listed, 1.3 s whole with identical
# references scored once).
WIDE_WINDOW = 8
# Scores closer than this fraction of their magnitude may round to one reported value.
ROUNDING_SLACK = 2.0**-16


class PairScores:
    """Scores of the pairs of ``query`` and ``reference`` rows (already rescaled), smaller
    is nearer: squared Euclidean distances, or negated inner products (``euclidean=False``),
    of the rows normalized as ``distance`` says."""

    def __init__(
        self,
        distance: BaseDistance,
        query: torch.Tensor,
        reference: torch.Tensor,
        euclidean: bool,
        block_bytes: int = 64 * 2**20,
        centre: torch.Tensor | None = None,
    ) -> None:
        """``block_bytes``: the budget of the reference blocks that :meth:`products`
        prepares (normalizes or converts) at a time, and of :meth:`of`'s temporaries.
        ``centre``: the vector the search moved both sides by (see ``_centring``), which
        :meth:`products` moves them by too; pair scores are of the rows as given."""
        self.distance, self.euclidean, self.block_bytes = distance, euclidean, block_bytes
        self.query, self.reference, self.centre = query, reference, centre
        wide = torch.float64 in (query.dtype, reference.dtype)
        self.dtype = torch.float64 if wide else torch.float32
        self._largest_norm: float | None = None
        self._distinct: tuple[PairScores, torch.Tensor] | None = None

    def of(self, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The scores of query ``rows[i]`` with reference ``indices[i]`` (one reference per
        row, or a row of them), in blocks whose temporaries stay small."""
        out = torch.empty(indices.shape, dtype=self.dtype, device=indices.device)
        per_row = indices[0].numel() if len(indices) else 1
        elements = min(BLOCK_ELEMENTS, self.block_bytes // 8)  # at most float64's
        step = max(1, elements // max(1, per_row * self.reference.shape[1]))
        for start in range(0, len(rows), step):
            part = slice(start, start + step)
            out[part] = self._scores(rows[part], indices[part])
        return out

    def of_every(self, rows: torch.Tensor) -> torch.Tensor:
        """The scores of query ``rows`` with every reference row; identical reference
        rows are scored once (their scores are equal: they come from the rows alone)."""
        if self._distinct is None:
            distinct, inverse = torch.unique(self.reference, dim=0, return_inverse=True)
            scores = PairScores(self.distance, self.query, distinct, self.euclidean)
            scores.block_bytes = self.block_bytes
            self._distinct = scores, inverse
        scores, inverse = self._distinct
        columns = torch.arange(len(scores.reference), device=rows.device)
        return scores.of(rows, columns.expand(len(rows), -1)).index_select(1, inverse)

    def _scores(self, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Each pair's score from its two prepared rows; the sums run over the last,
        contiguous axis, the same way whatever the shape."""
        query = self._prepared(self.query.index_select(0, rows))
        flat = self.reference.index_select(0, indices.flatten())
        reference = self._prepared(flat).view(*indices.shape, -1)
        if indices.dim() == 2:
            query = query.unsqueeze(1)
        if self.euclidean:  # pair by pair: coordinate differences, squared and summed
            difference = reference.sub_(query)
            return difference.mul_(difference).sum(dim=-1)
        return reference.mul_(query).sum(dim=-1).neg_()

    def _prepared(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (a fresh copy) in the scores' type, normalized if the distance
        normalizes."""
        return self.distance.maybe_normalize(rows.to(self.dtype), dim=1)

    def reported(self, scores: torch.Tensor) -> torch.Tensor:
        """The distances (or similarities) that ``scores`` stand for."""
        if not self.euclidean:
            return scores.neg()
        power = self.distance.power
        if power in (1, 2):  # a square root rounds correctly wherever it is computed
            return power_of_squared(scores.clamp_min(0), power)
        return _raised(scores.clamp_min(0), power / 2)

    def products(self, rows: torch.Tensor) -> torch.Tensor:
        """The scores of query ``rows`` with every reference row by matrix products, as a
        search computes them, a block of reference rows at a time (their prepared copies
        are one block's)."""
        row_bytes = self.reference.shape[1] * self.reference.element_size()
        step = max(1, self.block_bytes // max(1, row_bytes))
        out = torch.empty((len(rows), len(self.reference)), dtype=self.dtype, device=rows.device)
        query = self._moved(self.query[rows], self.reference)
        for start in range(0, len(self.reference), step):
            block = self._moved(self.reference[start : start + step], self.query)
            prepared, block, _ = self.distance.prepare(query, block)
            part = out[:, start : start + len(block)]
            if self.euclidean:
                squared = (block * block).sum(dim=1)
                torch.addmm(squared, prepared, block.T, alpha=-2, out=part)
                part += (prepared * prepared).sum(dim=1, keepdim=True)
            else:
                torch.mm(prepared, block.T, out=part).neg_()
        return out

    def tolerance(
        self, rows: torch.Tensor, size: torch.Tensor, searched: torch.dtype
    ) -> torch.Tensor:
        """Per query row, how far apart two scores of magnitude ``size`` or less must lie
        to be in the same order as a search in ``searched`` rounds them, and to be
        reported as two values."""
        return torch.maximum(self.error(rows, searched), size.double().abs() * ROUNDING_SLACK)

    def error(self, rows: torch.Tensor, searched: torch.dtype) -> torch.Tensor:
        """Per query row, a bound on how far a score computed by a matrix product of
        ``searched`` rows (norms and product rounded in that type, any summation order)
        lies from the pair's own score, doubled: two scores further apart than this are in
        the same order in both."""
        unit = torch.finfo(searched).eps / 2
        terms = self.query.shape[1] + 4  # coordinates, two squared norms, final roundings
        norms = self._norms(self.query[rows])
        largest = self._largest_reference_norm()
        # With S = |q|^2 + |r|^2: a product's sum of d + 2 terms rounds by at most (d + 2) u
        # times the sum of their magnitudes, at most 2 S (|2 q.r| <= S); the squared norms
        # by d u S; the pair's own differences and sum of their d squares by (d + 2) u
        # times the score, at most 2 S; one more d u S covers rows normalized apart (or,
        # with norms taken after a move by ``centre``, the move's rounding of the searched
        # rows, within 4 u S). An inner product rounds by d u |q| |r| on either side.
        if self.euclidean:
            per_score = 6 * terms * unit * (norms**2 + largest**2)
        else:
            per_score = 2 * terms * unit * norms * largest
        return 2 * per_score

    def _norms(self, rows: torch.Tensor) -> torch.Tensor:
        if self.distance.normalize_embeddings:
            return torch.ones(len(rows), dtype=torch.float64, device=rows.device)
        rows = rows.double()
        if self.centre is not None:
            rows = rows - self.centre
        return torch.linalg.vector_norm(rows, dim=1)

    def _moved(self, rows: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``rows`` (searched against ``other``) as the search scored them: less
        ``centre``, if it moved them."""
        if self.centre is None:
            return rows
        return centred(rows, self.centre, other)

    def _largest_reference_norm(self) -> float:
        if self._largest_norm is None:
            step = max(1, BLOCK_ELEMENTS // max(1, self.reference.shape[1]))
            largest = max(
                float(self._norms(self.reference[start : start + step]).max())
                for start in range(0, len(self.reference), step)
            )
            self._largest_norm = largest
        return self._largest_norm


def refine(
    pairs: PairScores,
    found: tuple[torch.Tensor, torch.Tensor],
    k: int,
    rows: tuple[bool, int],
    exclusion: Exclusion | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k neighbours by (pair score, index) of a search that ``found`` more than
    k candidates by product scores (or every reference), each with its pair's score.

    The candidates are scored from their pairs and sorted. A row whose k-th and last
    scores lie within :meth:`PairScores.tolerance` of each other could have a neighbour
    that the products ranked past its candidates: :func:`_first_k` searches it again
    whole. ``rows`` is ``(skip_self, rows per block)``: whether row i leaves reference i
    out, and how many whole rows are scored at a time; the candidates go as many at a
    time as that many whole rows hold, so the temporaries stay those of one block.
    """
    distances, indices = found
    num_rows, width = indices.shape
    values = torch.empty((num_rows, k), dtype=pairs.dtype, device=indices.device)
    nearest = torch.empty((num_rows, k), dtype=torch.long, device=indices.device)
    step = max(1, rows[1] * len(pairs.reference) // max(1, width))
    for start in range(0, num_rows, step):
        part = slice(start, start + step)
        query_rows = torch.arange(start, min(start + step, num_rows), device=indices.device)
        candidates = (distances[part], indices[part])
        values[part], nearest[part] = _refined(pairs, candidates, query_rows, k, rows, exclusion)
    return values, nearest


def _refined(
    pairs: PairScores,
    found: tuple[torch.Tensor, torch.Tensor],
    query_rows: torch.Tensor,
    k: int,
    rows: tuple[bool, int],
    exclusion: Exclusion | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`refine` of the candidates ``found`` for the query rows ``query_rows``."""
    distances, indices = found
    scores = pairs.of(query_rows, indices)
    scores[torch.isinf(distances)] = torch.inf  # no candidates left: excluded ones, last
    scores, order = torch.sort(scores, dim=1, stable=True)
    indices = indices.gather(1, order)
    values, indices = order_ties(pairs.reported(scores), indices, not pairs.euclidean)
    if indices.shape[1] > k:
        # a reference past the candidates has a product score at least the last one's,
        # so a pair score at least the last one's less the tolerance: the k-th's plus the
        # tolerance, where they lie two tolerances apart (never one reported value)
        gap = scores[:, -1] - scores[:, k - 1]
        ends = scores[:, [k - 1, -1]]
        largest = torch.where(torch.isfinite(ends), ends.abs(), 0).amax(dim=1)
        near = gap <= 2 * pairs.tolerance(query_rows, largest, distances.dtype)
        doubtful = (near | (values[:, -1] == values[:, k - 1])).nonzero().flatten()
        for start in range(0, len(doubtful), rows[1]):
            at = doubtful[start : start + rows[1]]
            values[at, :k], indices[at, :k] = _first_k(pairs, query_rows[at], k, rows, exclusion)
    return values[:, :k], indices[:, :k]


def _first_k(
    pairs: PairScores,
    block: torch.Tensor,
    k: int,
    rows: tuple[bool, int],
    exclusion: Exclusion | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k neighbours of the query rows ``block`` among all references: those
    whose product scores lie within the rounding of the k-th, scored from their pairs."""
    num_ref = len(pairs.reference)
    products = pairs.products(block)
    if rows[0]:  # a query is never its own neighbour
        products[torch.arange(len(block), device=block.device), block] = torch.inf
    if exclusion is not None:
        exclusion.fill(products, block, torch.inf)
    kth = torch.kthvalue(products, k, dim=1).values
    limit = kth.double() + pairs.tolerance(block, kth, products.dtype)
    window = products <= limit.unsqueeze(1).to(products.dtype)
    if int(window.sum()) * WIDE_WINDOW >= window.numel():
        return _first_k_of_wide(pairs, block, k, window & torch.isfinite(products))
    candidates = _in_rows(window, num_ref)
    known = candidates < num_ref
    at = candidates.clamp(max=num_ref - 1)
    scores = pairs.of(block, at)
    scores[~known | torch.isinf(products.gather(1, at))] = torch.inf
    # by (reported value, index): distinct scores can report one value (a square root
    # halves their difference); the candidates come by index
    values = pairs.reported(scores)
    key = values.neg() if not pairs.euclidean else values
    order = torch.sort(key, dim=1, stable=True).indices[:, :k]
    return values.gather(1, order), candidates.gather(1, order)


def _first_k_of_wide(
    pairs: PairScores, block: torch.Tensor, k: int, window: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_first_k` where the rounding of the products leaves most references near
    the k-th (ties, copies, coarse values): whole rows are scored from their pairs,
    those outside ``window`` (which leaves excluded ones out) as the worst."""
    scores = pairs.of_every(block)
    scores[~window] = torch.inf
    return first_k_of_rows(pairs.reported(scores), k, largest=not pairs.euclidean)


def _in_rows(mask: torch.Tensor, padding: int) -> torch.Tensor:
    """The columns of each row's true entries, in increasing order, padded with
    ``padding`` to the longest row's count."""
    at_row, at_column = mask.nonzero(as_tuple=True)
    counts = mask.sum(dim=1)
    place = torch.arange(len(at_row), device=mask.device) - (counts.cumsum(0) - counts)[at_row]
    out = torch.full((len(mask), int(counts.max())), padding, device=mask.device)
    out[at_row, place] = at_column
    return out


def _raised(values: torch.Tensor, exponent: float) -> torch.Tensor:
    """``values ** exponent``, each element the same wherever it lies in the tensor.

    PyTorch raises a contiguous tensor's elements in vector loops and the last few in a
    scalar loop, which round differently (the last bit of a float64 power followed its
    place). A strided copy takes the scalar loop for every element.
    """
    strided = torch.empty((values.numel(), 2), dtype=values.dtype, device=values.device)[:, 0]
    strided.copy_(values.flatten())
    return strided.pow_(exponent).reshape(values.shape)
