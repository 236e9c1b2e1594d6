"""Running top-k of score tiles in PyTorch: the searches a process makes before loading
numba pays (see ``COMPILED_LOAD_PAIRS`` in ``knn``) walk their tiles with this.

The contract of :class:`~._compiled_topk.CompiledTopK`, which the walks of
``_compiled_search`` feed alike: each row has a bound, and a tile's entries below their
row's bound are kept as candidates (a row without a bound first takes the k-th smallest
entry of its tile row, so that k entries pass). Where the compiled loops open a tile block
by block and tighten each bound as candidates accumulate, a tile here is filtered by a
few whole-tile operations (a comparison with the bounds, then the positions of the entries
that pass), and the bounds stay those the walk set from its sample until more than
``COMPACT_PER_ROW`` candidates per row (beyond k) are held: every row is then cut back to
its k smallest, which tightens its bound. A sampled bound lets about ``k + 3 sqrt(k n /
side)`` entries of a row of ``n`` pass, so at the sizes this serves the cut hardly ever
runs. Exact for the scores it is given, as the compiled loops are: an entry is dropped
only when k kept candidates of its row lie below it (or at it, after a cut); a row left
with fewer than k candidates is searched again by the walk. (The scores are a product's,
rounded by where a pair lies in it; ``_pair_scores`` makes the reported distances exact.)

Loading numba costs about 0.65 s of CPU, once per process, and the walk here 1.5 to 2.4
times the compiled one's CPU time (measured at n = 20,000, k = 11: 1.45 s against 0.95 s),
so a process's first searches of up to about 23,000 rows are quicker here.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

__all__ = ["FilteredTopK"]

# Candidates held per row, beyond k, before every row is cut back to its k smallest.
COMPACT_PER_ROW = 64
# torch.topk finds a k-th smallest up to this k (its cost grows with k); kthvalue beyond.
TOPK_MAX_RANK = 64
# Candidates are sorted in one (rows x most candidates of a row) matrix while it holds at
# most this many times the candidates (else all of them are sorted as one list).
DENSE_SLACK = 4
# Sort keys of the padding: above every (value, index) key.
_PAD_KEY = torch.iinfo(torch.int64).max


class FilteredTopK:
    """The k smallest float32 candidates per row, fed tile by tile (see the module).

    ``count`` and ``bound`` are NumPy arrays that the walks read and set, as those of
    :class:`~._compiled_topk.CompiledTopK`.

    Example:
        >>> state = FilteredTopK(num_rows=1, k=2)
        >>> state.push_rows(0, torch.tensor([[3.0, 1.0, 0.5, 9.0]]), first_index=0)
        >>> values, indices = state.finish()
        >>> values.tolist(), indices.tolist()
        ([[0.5, 1.0]], [[2, 1]])
    """

    def __init__(self, num_rows: int, k: int, threads: int | None = None) -> None:
        self.k = k
        self.num_rows = num_rows
        self.count = np.zeros(num_rows, dtype=np.int64)
        self.bound = np.full(num_rows, np.inf, dtype=np.float32)
        self.threads = max(1, threads if threads is not None else torch.get_num_threads())
        self._parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._held = 0
        self._lock = threading.Lock()
        self._finished = False

    def push_rows(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + c`` of row ``first_row + r``."""
        tile = _checked(scores)
        bound = self._bounds(first_row, tile)
        at = (tile < bound.unsqueeze(1)).nonzero()
        rows, columns = at[:, 0], at[:, 1]
        self._keep([(first_row, len(tile), rows, columns + first_index, tile[rows, columns])])

    def push_columns(self, first_row: int, scores: torch.Tensor, first_index: int) -> None:
        """Offer ``scores[r, c]`` as candidate ``first_index + r`` of row ``first_row + c``."""
        tile = _checked(scores)
        bound = self._bounds(first_row, tile.T)
        at = (tile < bound.unsqueeze(0)).nonzero()  # in the tile's own layout (much faster)
        rows, columns = at[:, 0], at[:, 1]
        kept = (first_row, tile.shape[1], columns, rows + first_index, tile[rows, columns])
        self._keep([kept])

    def push_both(self, first_row: int, scores: torch.Tensor, first_column: int) -> None:
        """Offer a tile of a symmetric matrix through its rows and its columns: ``scores[r,
        c]`` as candidate ``first_column + c`` of row ``first_row + r`` and as candidate
        ``first_row + r`` of row ``first_column + c``; one pass over the tile finds the
        entries below either bound. The tile must be off the diagonal."""
        tile = _checked(scores)
        height, width = tile.shape
        if first_row < first_column + width and first_column < first_row + height:
            raise ValueError("push_both takes a tile off the diagonal")
        row_bound = self._bounds(first_row, tile)
        column_bound = self._bounds(first_column, tile.T)
        at = (tile < torch.maximum(row_bound.unsqueeze(1), column_bound)).nonzero()
        rows, columns = at[:, 0], at[:, 1]
        values = tile[rows, columns]
        by_row = values < row_bound[rows]
        by_column = values < column_bound[columns]
        self._keep(
            [
                (first_row, height, rows[by_row], columns[by_row] + first_column, values[by_row]),
                (
                    first_column,
                    width,
                    columns[by_column],
                    rows[by_column] + first_row,
                    values[by_column],
                ),
            ]
        )

    def kth_smallest(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """The k-th smallest entry of each row of ``scores``."""
        if not 1 <= k <= scores.shape[1]:
            raise ValueError(f"kth_smallest needs 1 <= k <= {scores.shape[1]}; got k={k}")
        return _kth_smallest(_checked(scores), k)

    def finish(
        self, numbering: np.ndarray | None = None, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(values, indices)`` of each row's k smallest candidates, sorted by value
        and, among equal values, by index; a row with fewer than k candidates ends with
        ``inf`` at index 0.

        ``numbering`` renames candidate ``i`` to ``numbering[i]`` before the sort;
        ``positions`` puts row ``r`` at output row ``positions[r]``. A finished state takes
        no more candidates.
        """
        with self._lock:
            if self._finished:
                raise RuntimeError("FilteredTopK.finish was called twice")
            self._finished = True
            rows, indices, values = self._taken()
        if numbering is not None:
            indices = torch.from_numpy(numbering)[indices.long()]
        found = _first_k_by_row(rows, indices, values, self.num_rows, self.k)
        if positions is None:
            return found
        out_values, out_indices = torch.empty_like(found[0]), torch.empty_like(found[1])
        out_values[positions], out_indices[positions] = found
        return out_values, out_indices

    def _bounds(self, first_row: int, tile: torch.Tensor) -> torch.Tensor:
        """The bounds (a view) of the rows ``first_row:first_row + len(tile)`` fed the rows
        of ``tile``; a row without one takes the k-th smallest of its tile row, nudged up
        so that k entries lie below it (if the row has k)."""
        bound = torch.from_numpy(self.bound[first_row : first_row + len(tile)])
        unbounded = torch.isinf(bound).nonzero().flatten()
        if len(unbounded) and tile.shape[1] >= self.k:
            kth = _kth_smallest(tile[unbounded], self.k)
            bound[unbounded] = torch.nextafter(kth, torch.tensor(torch.inf))
        return bound

    def _keep(self, parts: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Hold candidates given as ``(first_row, rows, row offsets, candidates, values)``;
        when too many are held, cut every row back to its k smallest."""
        added = [
            torch.bincount(offsets, minlength=size).numpy() for _, size, offsets, _, _ in parts
        ]
        with self._lock:
            if self._finished:
                raise RuntimeError("a finished FilteredTopK takes no more candidates")
            for (first, size, offsets, candidates, values), counts in zip(parts, added):
                rows = (offsets + first).to(torch.int32)
                self._parts.append((rows, candidates.to(torch.int32), values))
                self.count[first : first + size] += counts
                self._held += len(values)
            if self._held > (self.k + COMPACT_PER_ROW) * self.num_rows:
                self._compact()

    def _taken(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every candidate held, as ``(rows, indices, values)``; none is held after."""
        parts, self._parts, self._held = self._parts, [], 0
        if not parts:
            empty = torch.zeros(0, dtype=torch.int32)
            return empty, empty, torch.zeros(0, dtype=torch.float32)
        return tuple(torch.cat(column) for column in zip(*parts))  # type: ignore[return-value]

    def _compact(self) -> None:
        """Cut every row back to its k smallest candidates, bounded by the k-th."""
        rows, indices, values = self._taken()
        order = _by_row_then_key(rows, _keys(values, indices))
        rows, indices, values = rows[order], indices[order], values[order]
        rank = _rank_in_row(rows, self.num_rows)
        keep = rank < self.k
        full = (rank == self.k - 1).nonzero().flatten()
        # a later entry equal to the k-th adds nothing to the k values: strictly below
        bound = torch.from_numpy(self.bound)
        full_rows = rows[full].long()
        bound[full_rows] = torch.minimum(bound[full_rows], values[full])
        self._parts = [(rows[keep], indices[keep], values[keep])]
        self._held = int(keep.sum())
        np.minimum(self.count, self.k, out=self.count)


def _checked(scores: torch.Tensor) -> torch.Tensor:
    if scores.dtype != torch.float32 or scores.device.type != "cpu":
        raise TypeError("FilteredTopK takes float32 CPU scores")
    return scores


def _kth_smallest(tile: torch.Tensor, k: int) -> torch.Tensor:
    if k <= TOPK_MAX_RANK:
        return torch.topk(tile, k, dim=1, largest=False, sorted=True).values[:, -1].contiguous()
    return torch.kthvalue(tile, k, dim=1).values


def _keys(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """int64 keys that order as (value, index) do: the float's bits made to order as
    integers (negative floats reversed) above the index (below 2**31)."""
    bits = values.view(torch.int32).long()
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered << 32) | indices.long()


def _by_row_then_key(rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The order of candidates by row, then key (two stable integer sorts)."""
    by_key = torch.sort(keys, stable=True).indices
    return by_key[torch.sort(rows[by_key], stable=True).indices]


def _rank_in_row(rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Each candidate's place in its row, for candidates sorted by row."""
    counts = torch.bincount(rows.long(), minlength=num_rows)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(len(rows)) - starts[rows.long()]


def _first_k_by_row(
    rows: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, num_rows: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest candidates by (value, index), padded with ``(inf, 0)``."""
    keys = _keys(values, indices)
    counts = torch.bincount(rows.long(), minlength=num_rows)
    width = max(k, int(counts.max()) if len(counts) else 0)
    if num_rows * width <= DENSE_SLACK * len(keys) + num_rows * k:
        # rows in a matrix, each sorted alone (fast: short rows)
        by_row = torch.sort(rows, stable=True).indices
        sorted_rows = rows[by_row].long()
        dense = torch.full((num_rows, width), _PAD_KEY, dtype=torch.int64)
        dense[sorted_rows, _rank_in_row(sorted_rows, num_rows)] = keys[by_row]
        first = torch.topk(dense, k, dim=1, largest=False, sorted=True).values
    else:
        order = _by_row_then_key(rows, keys)
        sorted_rows = rows[order].long()
        rank = _rank_in_row(sorted_rows, num_rows)
        keep = rank < k
        first = torch.full((num_rows, k), _PAD_KEY, dtype=torch.int64)
        first[sorted_rows[keep], rank[keep]] = keys[order][keep]
    return _decoded(first)


def _decoded(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of :func:`_keys`; the padding decodes to ``(inf, 0)``."""
    padding = keys == _PAD_KEY
    ordered = keys >> 32
    bits = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(torch.int32)
    values = bits.view(torch.float32).clone()
    indices = keys & 0xFFFFFFFF
    values[padding] = torch.inf
    indices[padding] = 0
    return values, indices
