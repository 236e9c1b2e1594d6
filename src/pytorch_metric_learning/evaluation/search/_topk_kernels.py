"""The compiled loops behind :mod:`._compiled_topk` (importing this module needs numba).

Every kernel works on a range of rows (or tile columns) so that Python threads can share a
tile; they release the GIL. The state of row ``r`` is its buffer ``values[r, :count[r]]``
(with ``indices``) and its bound ``bound[r]``.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 8
# Ranks up to which kth_smallest_rows inserts into a sorted list instead of selecting.
INSERTION_MAX_K = 24
# Rows with fewer candidates than this are sorted by comparisons in finish, not by radix.
RADIX_MIN_KEYS = 48

# No "ninf": inf is the bound of a row that has none yet.
_FAST = {"nnan", "nsz", "arcp", "contract", "reassoc", "afn"}
_jit = numba.njit(cache=True, nogil=True, fastmath=_FAST, boundscheck=False)
_inline = numba.njit(cache=True, nogil=True, fastmath=_FAST, boundscheck=False, inline="always")


@_inline
def _kth_smallest(source: np.ndarray, size: int, k: int, scratch: np.ndarray) -> np.float32:
    """The k-th smallest (1-based) of ``source[:size]``, by quickselect on ``scratch``."""
    for i in range(size):
        scratch[i] = source[i]
    low, high, want = 0, size - 1, k - 1
    while low < high:
        pivot = scratch[(low + high) >> 1]
        i, j = low, high
        while i <= j:
            while scratch[i] < pivot:
                i += 1
            while scratch[j] > pivot:
                j -= 1
            if i <= j:
                scratch[i], scratch[j] = scratch[j], scratch[i]
                i += 1
                j -= 1
        if want <= j:
            high = j
        elif want >= i:
            low = i
        else:
            break
    return scratch[want]


@_inline
def _shrink(
    values: np.ndarray,
    indices: np.ndarray,
    count: int,
    k: int,
    scratch: np.ndarray,
    ties: np.ndarray,
) -> tuple[int, np.float32]:
    """Keep the k smallest of the first ``count`` candidates; return (count, new bound)."""
    kth = _kth_smallest(values, count, k, scratch)
    kept = 0
    equal = 0
    for i in range(count):
        value = values[i]
        if value < kth:
            values[kept] = value
            indices[kept] = indices[i]
            kept += 1
        elif value == kth:
            ties[equal] = indices[i]
            equal += 1
    for i in range(min(equal, k - kept)):
        values[kept] = kth
        indices[kept] = ties[i]
        kept += 1
    return kept, kth


@_inline
def _first_bound(
    row: np.ndarray, width: int, k: int, minima: np.ndarray, scratch: np.ndarray
) -> np.float32:
    """Just above the k-th smallest minimum of equal groups of ``row[:width]``; inf if none.

    Groups are as large as ``BLOCK`` allows with at least k of them.
    """
    size = BLOCK
    while size > 1 and width // size < k:
        size //= 2
    groups = width // size
    if groups < k:
        return np.float32(np.inf)
    for g in range(groups):
        low = row[g * size]
        for t in range(1, size):
            low = min(low, row[g * size + t])
        minima[g] = low
    kth = np.float32(_kth_smallest(minima, groups, k, scratch))
    return np.nextafter(kth, np.float32(np.inf))


@_inline
def _offer_row(
    row: np.ndarray,
    own_values: np.ndarray,
    own_indices: np.ndarray,
    filled: int,
    limit: np.float32,
    k: int,
    first_index: int,
    scratch: np.ndarray,
    ties: np.ndarray,
    minima: np.ndarray,
) -> tuple[int, np.float32]:
    """Offer ``row[c]`` as candidate ``first_index + c`` to a row holding ``filled``
    candidates under ``limit``; return its new (count, bound)."""
    width = row.shape[0]
    capacity = own_values.shape[0]
    blocks = width // BLOCK
    if filled == 0 and limit == np.inf:
        limit = _first_bound(row, width, k, minima, scratch)
    for j0 in range(0, blocks * BLOCK, BLOCK):
        low = row[j0]
        for t in range(1, BLOCK):
            low = min(low, row[j0 + t])
        if low < limit:
            if filled + BLOCK > capacity:
                filled, limit = _shrink(own_values, own_indices, filled, k, scratch, ties)
            for t in range(BLOCK):
                value = row[j0 + t]
                own_values[filled] = value
                own_indices[filled] = first_index + j0 + t
                filled += value < limit
    for j in range(blocks * BLOCK, width):
        value = row[j]
        if value < limit:
            if filled == capacity:
                filled, limit = _shrink(own_values, own_indices, filled, k, scratch, ties)
            own_values[filled] = value
            own_indices[filled] = first_index + j
            filled += 1
    return filled, limit


@_inline
def _offer_rows(
    tile: np.ndarray, i0: int, i1: int, values: np.ndarray, indices: np.ndarray,
    count: np.ndarray, bound: np.ndarray, k: int, first_row: int, first_index: int,
    scratch: np.ndarray, ties: np.ndarray, minima: np.ndarray,
) -> None:  # fmt: skip
    """Offer row ``i`` of ``tile`` (``i0 <= i < i1``) to row ``first_row + i``."""
    for i in range(i0, i1):
        r = first_row + i
        count[r], bound[r] = _offer_row(
            tile[i], values[r], indices[r], count[r], bound[r], k, first_index,
            scratch, ties, minima,
        )  # fmt: skip


@_jit
def push_rows(
    tile: np.ndarray, values: np.ndarray, indices: np.ndarray, count: np.ndarray,
    bound: np.ndarray, k: int, first_row: int, first_index: int, start: int, stop: int,
) -> None:  # fmt: skip
    """Offer row ``i`` of ``tile`` (``start <= i < stop``) to row ``first_row + i``."""
    width = tile.shape[1]
    capacity = values.shape[1]
    scratch = np.empty(max(capacity, width), np.float32)
    ties = np.empty(capacity, np.int32)
    minima = np.empty(width, np.float32)
    _offer_rows(
        tile, start, stop, values, indices, count, bound, k, first_row, first_index,
        scratch, ties, minima,
    )  # fmt: skip


@_inline
def _column_minima(tile: np.ndarray, i0: int, start: int, stop: int, low: np.ndarray) -> None:
    """``low[j]``: the minimum of column ``start + j`` over tile rows ``i0 : i0 + BLOCK``.

    Eight rows at a time, written out, so that the loop over columns vectorizes.
    """
    for half in range(0, BLOCK, 8):
        r0 = tile[i0 + half, start:stop]
        r1 = tile[i0 + half + 1, start:stop]
        r2 = tile[i0 + half + 2, start:stop]
        r3 = tile[i0 + half + 3, start:stop]
        r4 = tile[i0 + half + 4, start:stop]
        r5 = tile[i0 + half + 5, start:stop]
        r6 = tile[i0 + half + 6, start:stop]
        r7 = tile[i0 + half + 7, start:stop]
        for j in range(stop - start):
            eight = min(
                min(min(r0[j], r1[j]), min(r2[j], r3[j])),
                min(min(r4[j], r5[j]), min(r6[j], r7[j])),
            )
            low[j] = eight if half == 0 else min(low[j], eight)


@_inline
def _append_column(
    tile: np.ndarray,
    i0: int,
    i1: int,
    column: int,
    values: np.ndarray,
    indices: np.ndarray,
    count: np.ndarray,
    k: int,
    r: int,
    first_index: int,
    limit: np.float32,
    scratch: np.ndarray,
    ties: np.ndarray,
) -> np.float32:
    """Append the entries of ``tile[i0:i1, column]`` below ``limit`` to row ``r``; its bound."""
    own_values = values[r]
    own_indices = indices[r]
    filled = count[r]
    if filled + (i1 - i0) > own_values.shape[0]:
        filled, limit = _shrink(own_values, own_indices, filled, k, scratch, ties)
    for i in range(i0, i1):
        value = tile[i, column]
        own_values[filled] = value
        own_indices[filled] = first_index + i
        filled += value < limit
    count[r] = filled
    return limit


@_inline
def _column_limits(
    tile: np.ndarray,
    count: np.ndarray,
    bound: np.ndarray,
    k: int,
    first_row: int,
    start: int,
    stop: int,
    limit: np.ndarray,
    scratch: np.ndarray,
) -> None:
    """``limit[j]``: the bound of the row fed by column ``start + j`` (from the whole column
    if the row has none yet)."""
    height = tile.shape[0]
    column = np.empty(height, np.float32)
    minima = np.empty(height, np.float32)
    for j in range(stop - start):
        r = first_row + start + j
        limit[j] = bound[r]
        if count[r] == 0 and limit[j] == np.inf:
            for i in range(height):
                column[i] = tile[i, start + j]
            limit[j] = _first_bound(column, height, k, minima, scratch)


@_inline
def _offer_columns(
    tile: np.ndarray,
    i0: int,
    i1: int,
    values: np.ndarray,
    indices: np.ndarray,
    count: np.ndarray,
    k: int,
    first_row: int,
    first_index: int,
    start: int,
    stop: int,
    low: np.ndarray,
    limit: np.ndarray,
    scratch: np.ndarray,
    ties: np.ndarray,
) -> None:
    """Offer ``tile[i, j]`` (``i0 <= i < i1``, at most ``BLOCK`` rows; ``start <= j < stop``)
    as candidate ``first_index + i`` to row ``first_row + j``, whose bound is
    ``limit[j - start]``."""
    if i1 - i0 == BLOCK:
        _column_minima(tile, i0, start, stop, low)
        for j in range(stop - start):
            if low[j] < limit[j]:
                limit[j] = _append_column(
                    tile, i0, i1, start + j, values, indices, count, k,
                    first_row + start + j, first_index, limit[j], scratch, ties,
                )  # fmt: skip
        return
    for i in range(i0, i1):
        for j in range(stop - start):
            if tile[i, start + j] < limit[j]:
                limit[j] = _append_column(
                    tile, i, i + 1, start + j, values, indices, count, k,
                    first_row + start + j, first_index, limit[j], scratch, ties,
                )  # fmt: skip


@_jit
def push_columns(
    tile: np.ndarray, values: np.ndarray, indices: np.ndarray, count: np.ndarray, bound: np.ndarray,
    k: int, first_row: int, first_index: int, start: int, stop: int,
) -> None:  # fmt: skip
    """Offer column ``j`` of ``tile`` (``start <= j < stop``) to row ``first_row + j``."""
    height, capacity = tile.shape[0], values.shape[1]
    scratch = np.empty(max(capacity, height), np.float32)
    ties = np.empty(capacity, np.int32)
    low = np.empty(stop - start, np.float32)
    limit = np.empty(stop - start, np.float32)
    _column_limits(tile, count, bound, k, first_row, start, stop, limit, scratch)
    for i0 in range(0, height, BLOCK):
        _offer_columns(
            tile, i0, min(i0 + BLOCK, height), values, indices, count, k, first_row,
            first_index, start, stop, low, limit, scratch, ties,
        )  # fmt: skip
    for j in range(stop - start):
        bound[first_row + start + j] = limit[j]


@_jit
def push_both(
    tile: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    k: int,
    first: tuple[int, int],
    indices: tuple[int, int],
    row_range: tuple[int, int],
    column_range: tuple[int, int],
    offer_rows: bool,
) -> None:
    """Offer a tile of a symmetric matrix through its rows and its columns, reading each
    ``BLOCK`` of its rows once for both.

    ``rows`` and ``columns`` are the ``(values, indices, count, bound)`` of the rows the
    tile's rows and columns feed, from ``first = (row, column)`` on; ``indices`` are the
    candidate numbers of the tile's first column and first row. Columns
    ``column_range`` take tile rows ``row_range``; with ``offer_rows``, so do those rows
    take the whole width.
    """
    values, row_indices, count, bound = rows
    column_values, column_indices, column_count, column_bound = columns
    first_row, first_column = first
    row_index, column_index = indices
    start, stop = column_range
    height, width = tile.shape
    capacity = values.shape[1]
    scratch = np.empty(max(capacity, height, width), np.float32)
    ties = np.empty(capacity, np.int32)
    minima = np.empty(max(height, width), np.float32)
    low = np.empty(stop - start, np.float32)
    limit = np.empty(stop - start, np.float32)
    _column_limits(tile, column_count, column_bound, k, first_column, start, stop, limit, scratch)
    for i0 in range(row_range[0], row_range[1], BLOCK):
        i1 = min(i0 + BLOCK, row_range[1])
        _offer_columns(
            tile, i0, i1, column_values, column_indices, column_count, k, first_column,
            column_index, start, stop, low, limit, scratch, ties,
        )  # fmt: skip
        if offer_rows:
            _offer_rows(
                tile, i0, i1, values, row_indices, count, bound, k, first_row, row_index,
                scratch, ties, minima,
            )  # fmt: skip
    for j in range(stop - start):
        column_bound[first_column + start + j] = limit[j]


_SIGN = np.uint32(0x80000000)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
_BYTE = np.uint64(0xFF)


@_inline
def _order_key(bits: np.uint32) -> np.uint32:
    """Unsigned bits that sort as the float32 whose bits these are (-0.0 before 0.0)."""
    return ~bits if bits & _SIGN else bits | _SIGN


@_inline
def _from_order_key(key: np.uint32) -> np.uint32:
    return key ^ _SIGN if key & _SIGN else ~key


@_inline
def _radix_sort(keys: np.ndarray, size: int, spare: np.ndarray, counts: np.ndarray) -> None:
    """Sort ``keys[:size]`` (uint64) in place, a byte at a time from the lowest (LSD radix),
    skipping the bytes that all keys share; ``spare`` holds ``size`` keys, ``counts`` is
    8 x 256."""
    counts[:, :] = 0
    for i in range(size):
        key = keys[i]
        for byte in range(8):
            counts[byte, (key >> np.uint64(8 * byte)) & _BYTE] += 1
    in_keys = True  # whether the keys, as sorted so far, are in ``keys`` or in ``spare``
    for byte in range(8):
        shift = np.uint64(8 * byte)
        starts = counts[byte]
        if size == 0 or starts[(keys[0] >> shift) & _BYTE] == size:
            continue  # the same byte in every key (keys[0]: any key has it)
        total = 0
        for digit in range(256):
            number = starts[digit]
            starts[digit] = total
            total += number
        source, target = (keys, spare) if in_keys else (spare, keys)
        for i in range(size):
            key = source[i]
            digit = (key >> shift) & _BYTE
            target[starts[digit]] = key
            starts[digit] += 1
        in_keys = not in_keys
    if not in_keys:
        keys[:size] = spare[:size]


@_jit
def finish(
    values: np.ndarray,
    indices: np.ndarray,
    count: np.ndarray,
    k: int,
    numbering: np.ndarray,
    out_rows: np.ndarray,
    out_values: np.ndarray,
    out_indices: np.ndarray,
    start: int,
    stop: int,
) -> None:
    """Rows ``start:stop`` of the k smallest candidates, sorted by value, then index
    (inf and -1 after them if fewer).

    Candidate ``i`` is named ``numbering[i]`` (``i`` if ``numbering`` is empty); row ``r``
    is written to output row ``out_rows[r]`` (``r`` if ``out_rows`` is empty).
    """
    capacity = values.shape[1]
    scratch = np.empty(capacity, np.float32)
    ties = np.empty(capacity, np.int32)
    keys = np.empty(capacity, np.uint64)
    spare = np.empty(capacity, np.uint64)
    counts = np.empty((8, 256), np.int64)
    renamed = numbering.shape[0] > 0
    for r in range(start, stop):
        filled = count[r]
        if filled > k:
            filled, _ = _shrink(values[r], indices[r], filled, k, scratch, ties)
        bits = values[r].view(np.uint32)
        for i in range(filled):
            index = indices[r, i]
            if renamed:
                index = numbering[index]
            high = np.uint64(_order_key(bits[i]))
            keys[i] = (high << _SHIFT) | np.uint64(np.uint32(index))
        if filled < RADIX_MIN_KEYS:
            keys[:filled].sort()
        else:
            _radix_sort(keys, filled, spare, counts)
        out = out_rows[r] if out_rows.shape[0] > 0 else r
        out_bits = out_values[out].view(np.uint32)
        for i in range(filled):
            out_bits[i] = _from_order_key(np.uint32(keys[i] >> _SHIFT))
            out_indices[out, i] = np.int64(keys[i] & _LOW32)
        out_values[out, filled:] = np.inf
        out_indices[out, filled:] = -1


@_inline
def _kth_smallest_by_insertion(row: np.ndarray, k: int, best: np.ndarray) -> np.float32:
    """The k-th smallest of ``row``: its k smallest kept sorted in ``best``, each entry
    below the k-th so far inserted (few are, when k is small against the row)."""
    for i in range(k):
        best[i] = np.inf
    top = best[k - 1]
    for j in range(row.shape[0]):
        value = row[j]
        if value < top:
            i = k - 1
            while i > 0 and best[i - 1] > value:
                best[i] = best[i - 1]
                i -= 1
            best[i] = value
            top = best[k - 1]
    return top


@_jit
def kth_smallest_rows(tile: np.ndarray, k: int, out: np.ndarray, start: int, stop: int) -> None:
    """``out[i]``: the k-th smallest entry of row ``i`` of ``tile``, for ``start <= i < stop``.

    For k up to ``INSERTION_MAX_K``, by insertion into the k smallest so far; above it,
    only the entries at or below a first bound (see ``_first_bound``) go through
    quickselect.
    """
    width = tile.shape[1]
    scratch = np.empty(width, np.float32)
    minima = np.empty(width, np.float32)
    below = np.empty(width, np.float32)
    for i in range(start, stop):
        row = tile[i]
        if k <= INSERTION_MAX_K:
            out[i] = _kth_smallest_by_insertion(row, k, below)
            continue
        limit = _first_bound(row, width, k, minima, scratch)
        kept = 0
        for j in range(width):
            value = row[j]
            below[kept] = value
            kept += value < limit
        out[i] = _kth_smallest(below, kept, k, scratch)
