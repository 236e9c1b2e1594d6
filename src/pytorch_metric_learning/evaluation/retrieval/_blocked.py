"""The k-NN metrics block by block of queries, when the whole k-NN outputs would not fit.

A query's k-NN metrics depend only on its own neighbours, so ``get_accuracy`` can search a
block of queries against the whole reference, compute the block's per-query values, keep
only those (one float64 per query and metric) and drop the block's neighbours before the
next block. The averages, per-class and per-category values, per-query returns and left-out
queries then come from the kept values exactly as from the whole outputs.

Each block's neighbours are the first ``k`` by (distance, index) that the search of the
whole query finds: a self-search asks for ``k + 1`` and drops each query's own row (or the
last neighbour when its own row is not among them), as the whole search does; a protocol's
exclusion is restricted to the block's rows. Memory then follows ``budget`` (the bytes of
one block's outputs: distances, indices and relevance) instead of ``num_queries x k``.

The Euclidean and inner-product searches read the reference where it lies, so each block
searches it whole. A search that copies it (a distance that normalizes the embeddings,
inputs of different dtypes, a distance without a one-GEMM scorer: see
:func:`~..search.knn.copies_reference`) would hold a copy as large as the reference; a
reference larger than ``REFERENCE_CHUNK_BYTES`` is then searched in chunks of rows, and each
chunk's first ``k`` merged by (distance, index), as ``CustomKNN`` merges the blocks of a
memory-mapped reference: the first ``k`` of the whole lie among the chunks' first ``k``.
Chunks cost time: each chunk's search keeps and sorts ``k`` candidates per query again
(at k = 2,000, four chunks of a 200,000-row reference took three times the time of the
whole).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..._mapped import trim_heap
from ..search._checked_search import search_knn
from ..search._excluded_search import search_excluding
from ..search._progress import SearchProgress
from ..search._rescale import _exponent, largest_magnitude
from ..search.knn import _merge_first_k, copies_reference, remove_self_matches
from ._categories import subset_stats
from ._label_stats import LabelComparison, LabelStats, relevance_of
from ._metric_names import per_query_function
from ._per_query import per_query_values
from ._protocol import Protocol, protocol_relevance
from .metrics import first_relevant_rank

__all__ = [
    "KNN_OUTPUT_BUDGET",
    "BlockedValues",
    "Blocks",
    "blocked_values",
    "output_bytes",
]

# Bytes of k-NN outputs (distances, indices, relevance) one get_accuracy call holds at once
# before it computes the metrics block by block of queries. A block's search and metrics
# take about three times this (the compiled search's candidates, the sorted outputs, the
# metrics' temporaries): measured at 30,000 rows and k = 1,000, the call grew by 204, 312
# and 596 MiB with budgets of 8, 32 and 128 MiB, loading numba (about 100 MiB) included.
KNN_OUTPUT_BUDGET = 32 * 2**20
# A reference larger than this, whose search would copy it, is searched in chunks of rows
# of about this size (without protocol rules, and when the embeddings need no rescaling:
# one scale for all chunks).
REFERENCE_CHUNK_BYTES = 32 * 2**20
# Index and relevance bytes of one neighbour, beside its distance.
_INDEX_AND_RELEVANCE_BYTES = 8 + 1


def output_bytes(num_queries: int, k: int, distance_bytes: int) -> int:
    """Bytes of the k-NN outputs of ``num_queries`` queries: distances, indices, relevance."""
    return num_queries * k * (distance_bytes + _INDEX_AND_RELEVANCE_BYTES)


@dataclass
class BlockedValues:
    """Each k-NN metric's value for every query, computed block by block.

    Attributes:
        values: ``{metric name: float64 tensor}``, one value per query (NaN for queries
            left out of the k-NN metrics).
        first_relevant_rank: Long tensor: each query's rank (from 1) of its first relevant
            neighbour, 0 when none of the retrieved ones is.
        num_retrieved: Neighbours retrieved per query.
    """

    values: dict[str, torch.Tensor]
    first_relevant_rank: torch.Tensor
    num_retrieved: int

    def __getitem__(self, rows: torch.Tensor) -> BlockedValues:
        """The values of the queries at ``rows`` (as the k-NN outputs are sliced)."""
        return BlockedValues(
            {name: value[rows] for name, value in self.values.items()},
            self.first_relevant_rank[rows],
            self.num_retrieved,
        )


@dataclass(frozen=True)
class Blocks:
    """What each block's search needs: the backend, the inputs and the rules.

    Attributes:
        knn_func: The k-NN backend (``CustomKNN``).
        query, reference: The embeddings.
        ref_includes_query: Query ``q`` is reference row ``q`` and is not its own neighbour.
        protocol: The protocol's exclusion and distractors, or None.
        rows: Queries per block.
        caller: Who searches, for messages.
        reference_rows: Reference rows searched at a time (None: the whole reference).
    """

    knn_func: Any
    query: torch.Tensor
    reference: torch.Tensor
    ref_includes_query: bool
    protocol: Protocol | None
    rows: int
    caller: str
    reference_rows: int | None = None

    @staticmethod
    def rows_for(budget: int, k: int, distance_bytes: int) -> int:
        """Queries per block so that one block's outputs stay within ``budget`` bytes."""
        return max(1, budget // max(1, output_bytes(1, k, distance_bytes)))

    @staticmethod
    def reference_rows_for(
        knn_func: Any, query: torch.Tensor, reference: torch.Tensor, protocol: Protocol | None
    ) -> int | None:
        """Reference rows per chunk, or None to search the whole reference at once."""
        row_bytes = max(1, reference.shape[1] * reference.element_size())
        if protocol is not None or len(reference) * row_bytes <= REFERENCE_CHUNK_BYTES:
            return None
        if not copies_reference(knn_func.distance, query, reference):
            return None
        if _exponent(largest_magnitude(query, reference)):
            return None
        return max(1, REFERENCE_CHUNK_BYTES // row_bytes)

    def count(self) -> int:
        return math.ceil(len(self.query) / self.rows)


def blocked_values(
    blocks: Blocks,
    k: int,
    names: list[str],
    stats: LabelStats,
    labels: tuple[torch.Tensor, torch.Tensor],
    comparison: LabelComparison | None,
    metric_block: int,
) -> BlockedValues:
    """The per-query values of the named built-in k-NN metrics, block by block of queries.

    ``labels`` is ``(query_labels, reference_labels)``; ``stats`` are those of the whole
    query (under the protocol, when there is one); ``metric_block`` bounds the relevance
    elements one metric call takes (as on the whole path).
    """
    num_queries = len(blocks.query)
    device = blocks.query.device
    values = {
        name: torch.full((num_queries,), math.nan, dtype=torch.float64, device=device)
        for name in names
    }
    ranks = torch.zeros(num_queries, dtype=torch.long, device=device)
    num_reference = len(blocks.reference)
    # one bar for the whole call: each block's search may be too short to draw its own
    with SearchProgress(num_queries * num_reference, "k-NN search in blocks") as progress:
        for start in range(0, num_queries, blocks.rows):
            stop = min(start + blocks.rows, num_queries)
            relevance = _block_relevance(blocks, k, (start, stop), stats, labels, comparison)
            ranks[start:stop] = first_relevant_rank(relevance)
            _block_values(values, relevance, stats, (start, stop), metric_block)
            progress.update((stop - start) * num_reference)
            trim_heap()  # the block's freed temporaries leave the C heap (see _mapped)
    return BlockedValues(values, ranks, k)


def _block_values(
    values: dict[str, torch.Tensor],
    relevance: torch.Tensor,
    stats: LabelStats,
    bounds: tuple[int, int],
    metric_block: int,
) -> None:
    """Write each metric's values of the block's non-lone queries into ``values``."""
    start, stop = bounds
    keep = stats.not_lone[start:stop]
    if not bool(keep.any()):
        return
    kept, num_relevant = relevance[keep], stats.num_relevant[start:stop][keep]
    for name, found in values.items():
        metric = per_query_function(name)
        assert metric is not None  # only built-in and parametrized metrics are blocked
        block = found[start:stop]
        block[keep] = per_query_values(metric, kept, num_relevant, metric_block)


def _block_relevance(
    blocks: Blocks,
    k: int,
    bounds: tuple[int, int],
    stats: LabelStats,
    labels: tuple[torch.Tensor, torch.Tensor],
    comparison: LabelComparison | None,
) -> torch.Tensor:
    """Boolean ``(stop - start, k)``: whether each neighbour of the block is relevant."""
    start, stop = bounds
    query_labels, reference_labels = labels
    block_stats = subset_stats(stats, torch.arange(start, stop, device=blocks.query.device))
    if blocks.protocol is None:
        indices = _block_neighbours(blocks, k, start, stop)
        valid = None
    else:
        _, indices, valid = search_excluding(
            blocks.knn_func,
            blocks.query[start:stop],
            k,
            blocks.reference,
            blocks.protocol.exclusion.query_rows(start, stop),
            caller=blocks.caller,
        )
    knn_labels = reference_labels[indices] if comparison is not None else None
    relevance = relevance_of(block_stats, indices, query_labels[start:stop], knn_labels, comparison)
    if blocks.protocol is not None:
        assert valid is not None
        relevance = protocol_relevance(relevance, indices, valid, blocks.protocol)
    return relevance


def _block_neighbours(blocks: Blocks, k: int, start: int, stop: int) -> torch.Tensor:
    """Indices of the first ``k`` neighbours of the queries ``start:stop``; in a self-search
    each query's own row is left out as the whole search leaves it out."""
    query = blocks.query[start:stop]
    if not blocks.ref_includes_query:
        return _search(blocks, query, k)[1]
    distances, indices = _search(blocks, query, k + 1)
    # query q's own row is start + q: shifted by -start, it is row q's as remove_self_matches
    # expects (no index of another row becomes q)
    return remove_self_matches(distances, indices - start)[1] + start


def _search(blocks: Blocks, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` neighbours of ``query`` in the reference, chunk by chunk of it."""
    reference, step = blocks.reference, blocks.reference_rows or len(blocks.reference)
    found: tuple[torch.Tensor, torch.Tensor] | None = None
    for first in range(0, len(reference), step):
        chunk = reference[first : first + step]
        (distances, indices), _ = search_knn(
            blocks.knn_func, query, min(k, len(chunk)), chunk, False, caller=blocks.caller
        )
        found = _merge_first_k(found, (distances, indices + first), k, blocks.knn_func.distance)
        del distances, indices
        trim_heap()  # the chunk's freed temporaries leave the C heap (see _mapped)
    assert found is not None  # a checked reference has rows
    return found
