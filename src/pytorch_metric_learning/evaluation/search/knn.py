"""Exact k-nearest-neighbour search in PyTorch."""

from __future__ import annotations

import logging
import math

import torch

from ..._mapped import copy_by_blocks, is_mapped, release, trim_heap
from ..._threads import adapted_threads
from ..._validation import (
    check_finite,
    check_matrix,
    check_positive_int,
    check_same_device,
    invalid,
)
from ...distances import BaseDistance, DotProductSimilarity, LpDistance
from ...distances.lp_distance import power_of_squared as _power_of_squared
from ...errors import InvalidArgumentError, InvalidTypeError
from . import _compiled_topk
from ._centring import centre_of, centred
from ._compiled_search import Sample, sample_first, search_compiled, spaced_sample
from ._pair_scores import PairScores, refine
from ._progress import SearchProgress
from ._rescale import Rescaled, _exponent, largest_magnitude, rescale
from ._ties import first_k_of_rows, order_ties, tied_at_boundary
from ._tiled_search import (
    NegatedInnerProduct,
    Scorer,
    SeparateSquaredEuclidean,
    SquaredEuclidean,
    search_symmetric,
    square_tile,
)
from ._topk import topk
from .exclusion import Exclusion

__all__ = ["CustomKNN", "copies_reference", "default_custom_knn", "remove_self_matches"]

logger = logging.getLogger(__name__)

# Bytes of one tile of distances when the user sets no batch_size.
TILE_BYTES = 64 * 2**20
# Bytes of a mapped reference (a memory-mapped .npy file) copied and searched at a time.
MAPPED_BLOCK_BYTES = 8 * 2**20
# Whole-row blocks get at least this many query rows (up to 4 * TILE_BYTES): a matrix
# product with fewer rows re-reads the whole reference too often (measured at 100,000
# references: 1.94 times the GEMM floor with 167 rows, 1.30 with 671).
MIN_BLOCK_ROWS = 512
# Self-search runs on symmetric tiles while the candidates that beat a row's running bound
# (about k (1 + ln(n / tile side)) of them) stay under n / SYMMETRIC_ROWS_PER_CANDIDATE;
# beyond that, handling them costs more than the halved matrix products save (fitted on the
# crossovers measured in docs/benchmarks.md: k = 20 at n = 30,000).
SYMMETRIC_ROWS_PER_CANDIDATE = 500
# Searches with at least this many query-reference pairs walk square tiles with a sampled
# first bound per row (see _compiled_search), with the compiled (numba) top-k once it is
# loaded: from n = 4,000 (self-search, k = 10 to 200) it takes 0.55 to 0.8 of the time of
# the other PyTorch paths.
COMPILED_MIN_PAIRS = 2**22
# Loading numba costs about 0.65 s of CPU, once per process (the first compilation ever, a
# few seconds, is then cached on disk): the searches of a process use it once their pairs,
# the current search's included, reach this many, those for LARGE_K neighbours or more
# counted twice (the compiled loops save the most there). Until then the same walk keeps
# its running top-k in PyTorch (_filtered_topk), at 1.5 to 2.4 times the compiled walk's
# CPU time: at n = 20,000 and k = 11, 1.45 s against 0.95 s plus the load. So the first search
# of 23,000 rows loads numba, or of 16,384 rows for k >= LARGE_K; a process that searches
# 16,000 rows every epoch loads it in its third search, or its second for k >= LARGE_K.
# Both walks hand their tiles to every thread (busy cores too, see _threads), so neither
# depends on the load of the machine.
COMPILED_LOAD_PAIRS = 2**29
LARGE_K = 100
# The PyTorch walk serves searches of up to this many pairs (where numba is not loaded, is
# disabled, or cannot be used); larger ones take the other PyTorch paths, as its bounds
# stay the sampled ones between cuts (see _filtered_topk).
FILTERED_MAX_PAIRS = 2**31
# ... and up to this many neighbours: its bounds stay loose between cuts, so for hundreds
# of neighbours it held several times the candidates and took 5-10 times as long as the
# other paths (outside attack: n = 6,000, k = 4,000, 18.7 s against 1.7 s).
FILTERED_MAX_K = 64
# Candidates merged at a time by _merge_first_k (2**20: 12 MiB of them and their order).
MERGE_ELEMENTS = 2**20
# Bytes per distance that recomputing whole rows for ties at the k-th place holds (the
# distances, and the masks, counts and keys of first_k_of_rows): rows are recomputed
# TILE_BYTES / (EXACT_ROW_BYTES x references) at a time.
EXACT_ROW_BYTES = 24
# The one-product distances search two neighbours more than asked, and one more per
# EXTRA_PER_K: the rows whose k-th and last candidates lie within the products' rounding
# bound, which are searched again whole, are then few. On 20,000 unit-norm rows: k = 11,
# 2-3% of the rows with one more, 0.02-0.08% with two; k = 266, 3,945 rows with one more
# (5.1 s in all), none with six (3.9 s).
EXTRA_PER_K = 64
# Bytes per reference that searching a row again whole holds (_pair_scores._first_k: the
# products, the mask of the references near the k-th and their positions, the candidates,
# their scores, values and order): at batch_size=1,000 on 10,000 identical rows (every row
# searched again, its candidates all 10,000), whose block of distances is 40 MB, the peak
# grew by 489 MiB with 1,000 rows at a time, by 66 MiB with 62.
REFINED_ROW_BYTES = 64
# Side of the square tiles of the compiled search.
COMPILED_TILE = 2048


class CustomKNN:
    """Exact k-NN search with any distance of :mod:`pytorch_metric_learning.distances`.

    Squared Euclidean, Euclidean, cosine and dot-product search run one matrix product per
    tile; each row's top k is selected below a threshold read off minima of column groups
    (see ``_topk``). Searching a set against itself (``reference=None`` or ``reference is
    query``) for few neighbours computes each tile of the symmetric distance matrix once
    for both its rows and its columns, with a running bound per row (see
    ``_running_topk``). Float32 searches on the CPU of ``COMPILED_MIN_PAIRS`` pairs or more
    (no ``batch_size``) walk square tiles, symmetric ones for self-search at any k, with a
    first bound per row sampled from the reference (see ``_compiled_search``); they select
    in compiled loops (numba) once the process's searches have reached
    ``COMPILED_LOAD_PAIRS`` pairs in all (which pays for loading numba), and with PyTorch
    operations before (``_filtered_topk``; also with ``PML_DISABLE_NUMBA=1``, up to
    ``FILTERED_MAX_PAIRS`` pairs and ``FILTERED_MAX_K`` neighbours). Other distances run
    through ``distance`` block by block. Embeddings too large or too small
    for float32 distances (say 1e20 or 1e-25) are searched after an exact power-of-two
    rescaling.

    Args:
        distance: Similarities (``is_inverted=True``) select the largest values, distances
            the smallest. Normalization follows ``distance.normalize_embeddings``.
        batch_size: If set, distances are computed in ``(batch_size, len(reference))``
            blocks, so peak memory is one such block plus the outputs and the running
            top-k (about twice the outputs). If None, tiles are sized to a memory budget
            of about 64 MiB each (up to 256 MiB, so that a block of whole rows of a large
            reference still holds 512 of them), whatever the sizes of the query and
            reference.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.distances import LpDistance
        >>> knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
        >>> distances, indices = knn(torch.tensor([[0.0, 0.0]]), 1, torch.tensor([[0.0, 1.0]]))
        >>> indices.tolist(), distances.tolist()
        ([[0]], [[1.0]])
    """

    def __init__(self, distance: BaseDistance, batch_size: int | None = None) -> None:
        if not isinstance(distance, BaseDistance):
            raise invalid("distance", "CustomKNN", "a BaseDistance", distance, InvalidTypeError)
        if batch_size is not None:
            batch_size = check_positive_int(batch_size, "batch_size", "CustomKNN")
        self.distance = distance
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"CustomKNN({self.distance!r}, batch_size={self.batch_size})"

    @torch.no_grad()
    def __call__(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
        *,
        exclusion: Exclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(distances, indices)`` of the ``k`` nearest reference rows, nearest first.

        ``reference=None`` searches ``query`` itself. ``exclusion`` (see
        :class:`~pytorch_metric_learning.evaluation.search.exclusion.Exclusion`) names pairs
        that are not candidates; they are scored as the worst value inside each tile, so
        memory stays that of a tile. A query with fewer than ``k`` candidates gets excluded
        references after its candidates, at distance ``inf`` (``-inf`` for similarities):
        ask ``exclusion.excluded_at(indices)`` which they are.
        """
        same = reference is None or reference is query
        query, reference = check_search_inputs(query, reference, "CustomKNN")
        # no autograd graph: grad mode is per thread, and the walk's tiles run on pool
        # threads too, where an input that requires grad would be tracked (or refused)
        query = query.detach()
        reference = query if same else reference.detach()
        search_k = check_search_k(k, len(reference), ref_includes_query, "CustomKNN")
        if exclusion is not None:
            exclusion = _checked_exclusion(exclusion, len(query), len(reference))
            if ref_includes_query:  # the self matches become one more rule
                rows = torch.arange(len(query), device=query.device)
                exclusion = exclusion.with_same_keys(
                    rows, torch.arange(len(reference), device=rows.device)
                )
                ref_includes_query, search_k = False, search_k - 1
        if not same and exclusion is None and is_mapped(reference):
            mapped = self._search_mapped(query, reference, search_k, ref_includes_query)
            if mapped is not None:
                return mapped[0][:, :k], mapped[1][:, :k]
        query = _widened(query)  # a mapped float16 input searched whole is read as float32
        reference = query if same else _widened(reference)
        logger.debug(
            "CustomKNN: %d queries, %d references, k=%d, %s",
            len(query),
            len(reference),
            k,
            self.distance,
        )
        out_dtype = self.distance.output_dtype(torch.promote_types(query.dtype, reference.dtype))
        scaled = rescale(self.distance, query, query if same else reference)
        centre = self._centre(scaled.reference)
        searched = _moved(scaled, centre, same)
        drop_self = ref_includes_query and same
        # one neighbour more shows the rows with a tie across the k-th place (see _ties);
        # a few more, the rows whose k-th could be outranked past them (see _pair_scores)
        extra = 1 if _scorer_kind(self.distance) is None else 2 + search_k // EXTRA_PER_K
        extra = min(extra, len(reference) - search_k)
        with adapted_threads(len(query) * len(reference), query.device):
            distances, indices, dropped = self._search(
                *searched, search_k + extra, (same, drop_self), exclusion
            )
            if ref_includes_query and not dropped:
                distances, indices = remove_self_matches(distances, indices)
            found = (distances, indices)
            distances, indices = self._first_k(
                found, (scaled, centre), k, (same, ref_includes_query), exclusion
            )
        return scaled.restore(distances, out_dtype), indices

    def _centre(self, reference: torch.Tensor) -> torch.Tensor | None:
        """The vector a Euclidean search moves its inputs by (see ``_centring``), if any."""
        if _scorer_kind(self.distance) is not SquaredEuclidean:
            return None
        return centre_of(self.distance, reference)

    def _first_k(
        self,
        found: tuple[torch.Tensor, torch.Tensor],
        inputs: tuple[Rescaled, torch.Tensor | None],
        k: int,
        self_search: tuple[bool, bool],
        exclusion: Exclusion | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k by (distance, index), from the search's ``found`` candidates (k + 1
        of them, or all); ``inputs`` are the rescaled rows and the vector the search moved
        them by; ``self_search`` is ``(same, skip_self)``."""
        scaled, centre = inputs
        kind = _scorer_kind(self.distance)
        if kind is None:
            return self._ordered(found, scaled, k, self_search, exclusion)
        # the one-product distances: each computed again from its pair alone (_pair_scores)
        same, skip_self = self_search
        reference = scaled.query if same else scaled.reference
        euclidean = kind is SquaredEuclidean
        pairs = PairScores(self.distance, scaled.query, reference, euclidean, TILE_BYTES, centre)
        # rows searched again whole at a time: as many as one block of float32 distances
        # holds (batch_size rows, or a tile's), their temporaries counted
        rows = max(1, self._rows(len(reference), 4) * 4 // REFINED_ROW_BYTES)
        return refine(pairs, found, k, (skip_self, rows), exclusion)

    def _ordered(
        self,
        found: tuple[torch.Tensor, torch.Tensor],
        scaled: Rescaled,
        k: int,
        self_search: tuple[bool, bool],
        exclusion: Exclusion | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k of the search's ``found`` candidates (k + 1 of them, or all) by
        (distance, index); rows tied across the k-th place are computed again whole."""
        # ties are of the distances as computed, before they are scaled back (which can
        # round distinct ones to one float32, or to 0 or inf)
        distances, indices = order_ties(*found, self.distance.is_inverted)
        tied = tied_at_boundary(distances, k)
        if len(tied):
            exact = self._exact_rows(scaled, tied, k, self_search, exclusion)
            distances, indices = distances.clone(), indices.clone()
            distances[tied, :k], indices[tied, :k] = exact
        return distances[:, :k], indices[:, :k]

    def _search_mapped(
        self, query: torch.Tensor, reference: torch.Tensor, k: int, ref_includes_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The first ``k`` by (distance, index) of a reference that views a mapped file.

        The reference is searched in blocks of about ``MAPPED_BLOCK_BYTES``, each copied
        out of the mapping (whose pages are then released) and searched exactly; a row's
        first ``k`` over the whole reference lie among its blocks' first ``k``, so merging
        them by (distance, index) is exact. A float16 file's blocks are searched as float32
        (the conversion is exact), in the blocks of a float32 file of the same values, so
        the results are those of that file's search bit for bit. ``None`` when the inputs
        need rescaling (one scale for all blocks): the whole reference is then searched.
        """
        if _exponent(largest_magnitude(query, reference)):
            return None
        query, dtype = _widened(query), _searched_dtype(reference.dtype)
        row_bytes = reference.shape[1] * dtype.itemsize
        rows = max(1, MAPPED_BLOCK_BYTES // max(1, row_bytes))
        found: tuple[torch.Tensor, torch.Tensor] | None = None
        for start in range(0, len(reference), rows):
            view = reference[start : start + rows]
            block = view.to(dtype, copy=True)  # the only copy: one block, as it is searched
            release(view)
            distances, indices = self(query, min(k, len(block)), block)
            found = _merge_first_k(found, (distances, indices + start), k, self.distance)
            del block, distances, indices
            trim_heap()  # the block's freed temporaries leave the C heap (see _mapped)
        assert found is not None  # a checked reference has rows
        if ref_includes_query:
            return remove_self_matches(*found)
        return found

    def _exact_rows(
        self,
        scaled: Rescaled,
        rows: torch.Tensor,
        k: int,
        self_search: tuple[bool, bool],
        exclusion: Exclusion | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k neighbours of the query ``rows`` by (distance, index), from whole rows
        of distances computed again (in blocks of about ``TILE_BYTES``); ``self_search``
        is ``(same, skip_self)``."""
        same, skip_self = self_search
        worst = -torch.inf if self.distance.is_inverted else torch.inf
        reference = scaled.query if same else scaled.reference
        found = []
        step = self._rows(len(reference), EXACT_ROW_BYTES)
        for start in range(0, len(rows), step):
            block = rows[start : start + step]
            values = self._whole_rows(scaled.query[block], reference)
            if skip_self:  # a query is never its own neighbour
                values[torch.arange(len(block), device=values.device), block] = worst
            if exclusion is not None:
                exclusion.fill(values, block, worst)
            found.append(first_k_of_rows(values, k, self.distance.is_inverted))
        return torch.cat([d for d, _ in found]), torch.cat([i for _, i in found])

    def _whole_rows(self, query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """The distances of the ``query`` rows to every reference row, computed a block of
        reference rows at a time (the distance's temporaries, such as squared norms or a
        normalized copy, are then one block's, not the whole reference's)."""
        step = max(1, TILE_BYTES // max(1, reference.shape[1] * reference.element_size()))
        values: torch.Tensor | None = None
        for start in range(0, len(reference), step):
            prepared, block, _ = self.distance.prepare(query, reference[start : start + step])
            part = self.distance.powered_mat(prepared, block)
            if values is None:
                values = part.new_empty((len(query), len(reference)))
            values[:, start : start + len(block)] = part
        assert values is not None  # a checked reference has rows
        return values

    def _search(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        k: int,
        self_search: tuple[bool, bool],
        exclusion: Exclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """``(values, indices, dropped)``; ``self_search`` is ``(same, drop_self)``;
        ``dropped``: each row's own index was left out and k - 1 neighbours found (only a
        self-search can drop it, and only if asked; the matrix-product paths do, by
        scoring each row's own entry as inf). ``exclusion`` (never with ``drop_self``)
        scores excluded pairs as the worst value, tile by tile."""
        same, drop_self = self_search
        if same:
            query = reference = self.distance.prepare(query, None)[0]
        else:
            query, reference, _ = self.distance.prepare(query, reference)
        if _scorer_kind(self.distance) is None:
            return (*self._search_generic(query, reference, k, exclusion), False)
        tile = self._tile(len(reference), query.element_size())
        walk = self._walk(query, reference, k)
        symmetric = (
            same
            and exclusion is None
            and (walk is not None or _symmetric_pays(k, len(reference), tile[0]))
        )
        size = (len(query), len(reference), k - 1 if drop_self else k)
        if walk is not None:
            values, indices, scorer = self._search_compiled(
                query, reference, size, (symmetric, drop_self, walk), exclusion
            )
        else:
            scorer = _fast_scorer(self.distance, query, reference, symmetric)
            if symmetric:
                values, indices = search_symmetric(scorer, size, tile, query, drop_self)
            else:
                values, indices = self._search_rows(scorer, size, query, drop_self, exclusion)
        if isinstance(scorer, (SquaredEuclidean, SeparateSquaredEuclidean)):
            values = _power_of_squared(values, self.distance.power)
        return values, indices, drop_self

    def _search_compiled(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        size: tuple[int, int, int],
        self_search: tuple[bool, bool, bool],
        exclusion: Exclusion | None,
    ) -> tuple[torch.Tensor, torch.Tensor, Scorer]:
        """``search_compiled`` over the reference reordered so that its first tile column
        is an evenly spaced sample; a symmetric self-search reorders both sides alike.
        ``self_search`` is ``(symmetric, drop_self, compiled)``; ``compiled=False`` walks
        the tiles with the running top-k in PyTorch (``_filtered_topk``)."""
        symmetric, drop_self, compiled = self_search
        if not symmetric:
            return self._search_compiled_in_place(
                query, reference, size, (drop_self, compiled), exclusion
            )
        order = sample_first(len(reference), COMPILED_TILE)
        scorer = _fast_scorer(self.distance, query, reference, symmetric, order)
        del query, reference  # the scorer keeps what it needs
        values, indices = search_compiled(
            scorer, size, symmetric, COMPILED_TILE, drop_self, order, compiled=compiled
        )
        return scorer.finish(values), indices, scorer

    def _search_compiled_in_place(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        size: tuple[int, int, int],
        walk: tuple[bool, bool],
        exclusion: Exclusion | None,
    ) -> tuple[torch.Tensor, torch.Tensor, Scorer]:
        """``search_compiled`` of the row-by-row walk over the reference as it lies (no
        reordered copy): each row's first bound comes from an evenly spaced sample.
        ``walk`` is ``(drop_self, compiled)``."""
        drop_self, compiled = walk
        scorer: SeparateSquaredEuclidean | NegatedInnerProduct
        if _scorer_kind(self.distance) is SquaredEuclidean:
            scorer = SeparateSquaredEuclidean(query, reference)
        else:
            scorer = NegatedInnerProduct(query, reference)
        rows = spaced_sample(len(reference), COMPILED_TILE)
        sample = None if rows is None else Sample(scorer.columns(rows), rows)
        values, indices = search_compiled(
            scorer,
            size,
            False,
            COMPILED_TILE,
            drop_self,
            exclusion=exclusion,
            sample=sample,
            compiled=compiled,
        )
        return scorer.finish(values), indices, scorer

    def _search_rows(
        self,
        scorer: Scorer,
        size: tuple[int, int, int],
        like: torch.Tensor,
        skip_self: bool,
        exclusion: Exclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole rows of scores per block, each reduced by the grouped top-k.

        ``size`` is ``(num_query, num_ref, k)``; ``skip_self`` (a set searched against
        itself) leaves each row's own entry out, ``exclusion`` its excluded pairs.
        """
        num_query, num_ref, k = size
        values = torch.empty((num_query, k), dtype=like.dtype, device=like.device)
        indices = torch.empty((num_query, k), dtype=torch.long, device=like.device)
        rows = self._rows(num_ref, like.element_size(), grow=True)
        buffer = torch.empty(min(rows, num_query) * num_ref, dtype=like.dtype, device=like.device)
        every = slice(0, num_ref)
        with SearchProgress(num_query * num_ref) as progress:
            for start in range(0, num_query, rows):
                block = slice(start, min(start + rows, num_query))
                out = buffer[: (block.stop - start) * num_ref].view(-1, num_ref)
                scores = scorer.tile(block, every, out)
                if skip_self:
                    scores.diagonal(offset=start).fill_(torch.inf)
                if exclusion is not None:
                    exclusion.fill(scores, block, torch.inf)
                values[block], indices[block] = topk(scores, k, largest=False)
                progress.update(scores.numel())
        return scorer.finish(values), indices

    def _walk(self, query: torch.Tensor, reference: torch.Tensor, k: int) -> bool | None:
        """Whether this search walks square tiles with a sampled first bound per row (large
        float32 CPU searches): True with the compiled top-k, False with PyTorch's (before
        numba is worth loading, or where it cannot be), None if it takes other paths."""
        pairs = len(query) * len(reference)
        if not (
            self.batch_size is None
            and query.device.type == "cpu"
            and query.dtype == torch.float32
            and reference.dtype == torch.float32
            and pairs >= COMPILED_MIN_PAIRS
            and len(reference) < 2**31  # its candidates' indices are int32
        ):
            return None
        if _compiled_loads(pairs * 2 if k >= LARGE_K else pairs):
            return True
        return False if pairs <= FILTERED_MAX_PAIRS and k <= FILTERED_MAX_K else None

    def _rows(self, num_reference: int, element_size: int, grow: bool = False) -> int:
        """Query rows per block: ``batch_size``, or as many as the memory budget allows.

        ``grow`` (matrix-product blocks only) lets a block of a large reference exceed the
        budget, up to four times, to reach ``MIN_BLOCK_ROWS``.
        """
        if self.batch_size is not None:
            return self.batch_size
        row_bytes = max(num_reference, 1) * element_size
        rows = TILE_BYTES // row_bytes
        if grow and rows < MIN_BLOCK_ROWS:
            rows = min(MIN_BLOCK_ROWS, 4 * TILE_BYTES // row_bytes)
        return max(1, rows)

    def _tile(self, num_reference: int, element_size: int) -> tuple[int, int]:
        if self.batch_size is not None:
            return self.batch_size, max(num_reference, 1)
        side = square_tile(TILE_BYTES, element_size)
        return side, side

    def _search_generic(
        self, query: torch.Tensor, ref: torch.Tensor, k: int, exclusion: Exclusion | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        distances, indices = _empty_outputs(query, ref, k)
        rows = self._rows(len(ref), query.element_size())
        worst = -torch.inf if self.distance.is_inverted else torch.inf
        with SearchProgress(len(query) * len(ref)) as progress:
            for start in range(0, len(query), rows):
                block = query[start : start + rows]
                values = self.distance.powered_mat(block, ref)
                if exclusion is not None:
                    exclusion.fill(values, slice(start, start + len(block)), worst)
                top_values, top_indices = topk(values, k, largest=self.distance.is_inverted)
                distances[start : start + len(block)] = top_values
                indices[start : start + len(block)] = top_indices
                progress.update(values.numel())
        return distances, indices


def default_custom_knn(
    distance: BaseDistance | None = None, batch_size: int | None = None
) -> CustomKNN:
    """The ``custom`` backend: exact squared Euclidean search unless ``distance`` is given.

    Without ``batch_size``, tiles are sized by a memory budget (see :class:`CustomKNN`).

    Example:
        >>> default_custom_knn()
        CustomKNN(LpDistance(normalize_embeddings=False, p=2, power=2, is_inverted=False), batch_size=None)
    """
    if distance is None:
        distance = LpDistance(normalize_embeddings=False, power=2)
    return CustomKNN(distance, batch_size=batch_size)


def check_search_inputs(
    query: torch.Tensor, reference: torch.Tensor | None, owner: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a k-NN query and reference; ``reference=None`` means the query itself."""
    check_matrix(query, "query", owner)
    if reference is None:
        return check_finite(query, "query", owner), query
    check_matrix(reference, "reference", owner)
    check_same_device(query, reference, "query and reference", owner)
    if query.shape[1] != reference.shape[1]:
        raise InvalidArgumentError(
            f"The query and reference of {owner} must have the same number of columns. "
            f"Got {query.shape[1]} and {reference.shape[1]} instead."
        )
    return check_finite(query, "query", owner), check_finite(reference, "reference", owner)


def check_search_k(k: int, num_reference: int, ref_includes_query: bool, owner: str) -> int:
    """Validate ``k``; return how many neighbours to search (``k + 1`` to drop self matches)."""
    k = check_positive_int(k, "k", owner)
    search_k = k + 1 if ref_includes_query else k
    if search_k > num_reference:
        most = num_reference - 1 if ref_includes_query else num_reference
        raise InvalidArgumentError(
            f"The 'k' parameter of {owner} must be at most {most} for a reference of "
            f"{num_reference} rows{' that includes the query' if ref_includes_query else ''}. "
            f"Got {k} instead."
        )
    return search_k


def remove_self_matches(
    distances: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop row ``i``'s own index from row ``i``, or its last neighbour if ``i`` is absent.

    Example:
        >>> d = torch.tensor([[0.0, 1.0, 2.0], [0.5, 0.7, 0.9]])
        >>> i = torch.tensor([[0, 4, 5], [3, 4, 6]])
        >>> remove_self_matches(d, i)[1].tolist()
        [[4, 5], [3, 4]]
    """
    num_rows, width = indices.shape
    own = indices == torch.arange(num_rows, device=indices.device).unsqueeze(1)
    dropped = torch.where(own.any(dim=1), own.to(torch.uint8).argmax(dim=1), width - 1)
    keep = torch.arange(width - 1, device=indices.device).expand(num_rows, -1)
    keep = keep + (keep >= dropped.unsqueeze(1))  # the columns after the dropped one
    return distances.gather(1, keep), indices.gather(1, keep)


def _moved(
    scaled: Rescaled, centre: torch.Tensor | None, same: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The query and reference to search: the rescaled rows, less ``centre`` if given
    (one copy for a self-search, which stays one)."""
    query, reference = scaled.query, scaled.query if same else scaled.reference
    if centre is None:
        return query, reference
    moved = centred(query, centre, reference)
    return moved, moved if same else centred(reference, centre, query)


def _searched_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a mapped tensor's blocks are searched in: float16 as float32 (exactly)."""
    return torch.float32 if dtype == torch.float16 else dtype


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    """A mapped float16 tensor as float32, in memory (copied block by block): the searches
    that need it whole (self-search, exclusions, rescaling) read it so. Others as given."""
    if tensor.dtype != torch.float16 or not is_mapped(tensor):
        return tensor
    return copy_by_blocks(tensor, torch.float32)


def _merge_first_k(
    found: tuple[torch.Tensor, torch.Tensor] | None,
    block: tuple[torch.Tensor, torch.Tensor],
    k: int,
    distance: BaseDistance,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` by (distance, index) of the neighbours found so far and a later block's.

    Both are ordered by (distance, index) and every index found so far is below the block's,
    so a stable sort of the distances, found ones first, orders ties by index.
    """
    if found is None:
        return block
    width = min(k, found[0].shape[1] + block[0].shape[1])
    num_rows = len(found[0])
    distances = found[0].new_empty((num_rows, width))
    indices = found[1].new_empty((num_rows, width))
    # rows a few at a time: the sort's temporaries stay small beside the outputs
    step = max(1, MERGE_ELEMENTS // max(1, 2 * width))
    for start in range(0, num_rows, step):
        rows = slice(start, start + step)
        both = torch.cat([found[0][rows], block[0][rows]], dim=1)
        order = torch.sort(both, dim=1, descending=distance.is_inverted, stable=True)[1]
        order = order[:, :width]
        distances[rows] = both.gather(1, order)
        indices[rows] = torch.cat([found[1][rows], block[1][rows]], dim=1).gather(1, order)
    return distances, indices


def _checked_exclusion(exclusion: Exclusion, num_query: int, num_reference: int) -> Exclusion:
    if not isinstance(exclusion, Exclusion):
        raise invalid("exclusion", "CustomKNN", "an Exclusion", exclusion, InvalidTypeError)
    if (exclusion.num_query, exclusion.num_reference) != (num_query, num_reference):
        raise invalid(
            "exclusion",
            "CustomKNN",
            f"an Exclusion for {num_query} queries and {num_reference} references",
            f"one for {exclusion.num_query} and {exclusion.num_reference}",
        )
    return exclusion


def _symmetric_pays(k: int, num_rows: int, tile_side: int) -> bool:
    """Whether symmetric tiles beat whole rows for a self-search of ``num_rows`` with ``k``."""
    candidates = k * (1 + math.log(max(num_rows / tile_side, 1.0)))
    return candidates * SYMMETRIC_ROWS_PER_CANDIDATE <= num_rows


_cold_pairs = 0  # pairs of the searches that could have run compiled before it was loaded


def _compiled_loads(pairs: int) -> bool:
    """Whether the compiled top-k is loaded, or worth loading now (numba imported only then);
    ``pairs`` is this search's count toward ``COMPILED_LOAD_PAIRS``."""
    global _cold_pairs
    if _compiled_topk.loaded():
        return True
    if not _compiled_topk.installed():
        return False
    _cold_pairs += pairs
    return _cold_pairs >= COMPILED_LOAD_PAIRS and _compiled_topk.available()


def copies_reference(distance: BaseDistance, query: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether a separate search of ``query`` in ``reference`` copies the whole reference
    (normalized, or converted to a common dtype, or for a distance without a one-GEMM
    scorer); the Euclidean and inner-product scorers read it where it lies.

    Example:
        >>> x = torch.zeros(3, 2)
        >>> copies_reference(LpDistance(normalize_embeddings=False), x, x)
        False
        >>> copies_reference(LpDistance(), x, x)  # normalizes
        True
    """
    common = torch.promote_types(query.dtype, reference.dtype)
    return (
        _scorer_kind(distance) is None
        or distance.normalize_embeddings
        or common != reference.dtype
        or common in (torch.float16, torch.bfloat16)
    )


def _scorer_kind(distance: BaseDistance) -> type[SquaredEuclidean | NegatedInnerProduct] | None:
    """The one-GEMM-per-tile scorer class for the distances that have one, else None."""
    if (
        isinstance(distance, LpDistance)
        and type(distance).compute_mat is LpDistance.compute_mat
        and distance.p == 2
        and distance.power > 0
    ):
        return SquaredEuclidean
    if (
        isinstance(distance, DotProductSimilarity)
        and type(distance).compute_mat is DotProductSimilarity.compute_mat
        and distance.power == 1
    ):
        return NegatedInnerProduct
    return None


def _fast_scorer(
    distance: BaseDistance,
    query: torch.Tensor,
    ref: torch.Tensor,
    same: bool,
    order: torch.Tensor | None = None,
) -> SquaredEuclidean | SeparateSquaredEuclidean | NegatedInnerProduct:
    """The one-GEMM-per-tile scorer of a distance that has one; ``order`` reorders the
    reference rows (and the query's, when ``ref is query``). A separate search in the
    reference's own order reads the reference where it lies."""
    if _scorer_kind(distance) is SquaredEuclidean:
        if not same and order is None and ref is not query:
            return SeparateSquaredEuclidean(query, ref)
        return SquaredEuclidean(query, ref, symmetric=same, order=order)
    return NegatedInnerProduct(query, ref, order)


def _empty_outputs(
    query: torch.Tensor, ref: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.promote_types(query.dtype, ref.dtype)
    distances = torch.empty((len(query), k), dtype=dtype, device=query.device)
    indices = torch.empty((len(query), k), dtype=torch.long, device=query.device)
    return distances, indices
