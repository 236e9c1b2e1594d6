"""Which (query, reference) pairs are not candidates, as rules instead of a dense mask.

Evaluation protocols take some references out of some queries' rankings: re-identification
drops the gallery images of the query's identity taken by the query's camera, a set that
plays both roles never retrieves an item for itself, and users list pairs to skip. A
``(num_query, num_reference)`` mask of them is quadratic in memory; an :class:`Exclusion`
holds the rules (linear in the inputs) and turns them into the excluded pairs of one block
of query rows when a tiled search reaches it, so the search's memory stays that of a tile.

Three kinds of rule, any number of each combined (a pair is excluded when any rule says so):

- *same keys*: reference ``j`` is not a candidate for query ``q`` when
  ``query_keys[q] == reference_keys[j]`` (e.g. one key per (label, camera), or per item);
- *pairs*: an explicit ``(m, 2)`` list of ``(query index, reference index)``;
- *references*: a boolean flag per reference that is never a candidate (junk).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError, InvalidTypeError

__all__ = ["Exclusion", "key_pairs"]

OWNER = "Exclusion"
# Excluded pairs materialized at once when a whole query set is scanned (about 32 MiB).
_PAIRS_BLOCK = 1 << 21
# Row blocks whose excluded pairs a tiled search keeps, sorted by column, while it walks
# their column tiles (a few per thread).
_CACHED_BLOCKS = 8


@dataclass(frozen=True)
class _KeyRule:
    """Excludes, for query ``q``, ``targets[lo:hi]``: the entries of ``sorted_keys`` equal
    to ``query_keys[q]``."""

    query_keys: torch.Tensor
    sorted_keys: torch.Tensor
    targets: torch.Tensor

    def pairs_of(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(position in rows, reference index)`` of every pair the rule excludes."""
        keys = self.query_keys[rows]
        low = torch.searchsorted(self.sorted_keys, keys, right=False)
        high = torch.searchsorted(self.sorted_keys, keys, right=True)
        counts = high - low
        position = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), counts)
        starts = torch.repeat_interleave(low - (torch.cumsum(counts, 0) - counts), counts)
        offsets = torch.arange(len(position), device=rows.device) + starts
        return position, self.targets[offsets]

    def count_per_query(self) -> torch.Tensor:
        """How many pairs the rule excludes for each query (duplicates included)."""
        high = torch.searchsorted(self.sorted_keys, self.query_keys, right=True)
        return high - torch.searchsorted(self.sorted_keys, self.query_keys, right=False)

    def for_queries(self, rows: torch.Tensor) -> _KeyRule:
        """The rule for the query rows ``rows`` alone, renumbered ``0 .. len(rows) - 1``."""
        return _KeyRule(self.query_keys[rows], self.sorted_keys, self.targets)

    def restricted(self, position: torch.Tensor) -> _KeyRule:
        """The rule over the references whose ``position`` is not -1, renumbered by it."""
        targets = position[self.targets]
        kept = targets >= 0
        return _KeyRule(self.query_keys, self.sorted_keys[kept], targets[kept])


class Exclusion:
    """Pairs of a query and a reference that are not candidates for each other.

    Built from rules, never from a dense mask: a search asks :meth:`pairs_of` for the
    excluded pairs of one block of query rows (or :meth:`fill` to score them as the worst
    value), so memory grows with the block and the number of excluded pairs in it.

    Args:
        num_query: Rows of the query.
        num_reference: Rows of the reference.
        same_keys: ``(query_keys, reference_keys)`` integer tensors, one key per row:
            reference ``j`` is excluded for query ``q`` when the keys are equal.
        pairs: ``(m, 2)`` integer tensor of excluded ``(query index, reference index)``.
        never_candidates: Boolean flag per reference that is no query's candidate.

    Example:
        >>> import torch
        >>> rule = Exclusion(2, 3, same_keys=[(torch.tensor([0, 1]), torch.tensor([1, 0, 1]))])
        >>> [pair.tolist() for pair in rule.pairs_of(torch.tensor([0, 1]))]
        [[0, 1, 1], [1, 0, 2]]
    """

    def __init__(
        self,
        num_query: int,
        num_reference: int,
        same_keys: list[tuple[torch.Tensor, torch.Tensor]] | tuple[()] = (),
        pairs: torch.Tensor | None = None,
        never_candidates: torch.Tensor | None = None,
    ) -> None:
        self.num_query, self.num_reference = int(num_query), int(num_reference)
        rules = [self._same_key_rule(q, r) for q, r in same_keys]
        if pairs is not None:
            rules.append(self._pair_rule(pairs))
        self._rules = rules
        self.never_candidates = self._flags(never_candidates)
        self._start_cache()

    def _start_cache(self) -> None:
        """The never-candidate columns as sorted indices, and an empty cache of row blocks."""
        flags = self.never_candidates
        self._never_columns = None if flags is None else flags.nonzero().flatten()
        self._blocks: OrderedDict[tuple[int, int], tuple[torch.Tensor, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        junk = 0 if self.never_candidates is None else int(self.never_candidates.sum())
        return (
            f"Exclusion({self.num_query} queries, {self.num_reference} references, "
            f"{len(self._rules)} pair rules, {junk} references never candidates)"
        )

    # ----- building -----

    def _same_key_rule(self, query_keys: torch.Tensor, reference_keys: torch.Tensor) -> _KeyRule:
        query_keys = _integer_vector(query_keys, "same_keys (query keys)", self.num_query)
        reference_keys = _integer_vector(
            reference_keys, "same_keys (reference keys)", self.num_reference
        )
        sorted_keys, order = torch.sort(reference_keys, stable=True)
        return _KeyRule(query_keys, sorted_keys, order)

    def _pair_rule(self, pairs: torch.Tensor) -> _KeyRule:
        if not isinstance(pairs, torch.Tensor):
            raise invalid("pairs", OWNER, "a torch.Tensor", type(pairs).__name__, InvalidTypeError)
        if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.is_floating_point():
            raise invalid(
                "pairs", OWNER, "an (m, 2) integer tensor", f"{pairs.dtype} {tuple(pairs.shape)}"
            )
        pairs = pairs.long()
        for column, size, role in (
            (0, self.num_query, "query"),
            (1, self.num_reference, "reference"),
        ):
            values = pairs[:, column]
            if len(values) and (int(values.min()) < 0 or int(values.max()) >= size):
                raise invalid(
                    "pairs",
                    OWNER,
                    f"{role} indices in [0, {size})",
                    f"indices from {int(values.min())} to {int(values.max())}",
                )
        sorted_queries, order = torch.sort(pairs[:, 0], stable=True)
        identity = torch.arange(self.num_query, device=pairs.device)
        return _KeyRule(identity, sorted_queries, pairs[order, 1])

    def _flags(self, flags: torch.Tensor | None) -> torch.Tensor | None:
        if flags is None:
            return None
        if not isinstance(flags, torch.Tensor) or flags.dtype != torch.bool:
            got = flags.dtype if isinstance(flags, torch.Tensor) else type(flags).__name__
            raise invalid("never_candidates", OWNER, "a bool tensor", got, InvalidTypeError)
        if flags.shape != (self.num_reference,):
            raise invalid(
                "never_candidates",
                OWNER,
                f"one flag per reference ({self.num_reference})",
                f"shape {tuple(flags.shape)}",
            )
        return flags if bool(flags.any()) else None

    # ----- asking -----

    @property
    def excludes_nothing(self) -> bool:
        return not self._rules and self.never_candidates is None

    def pairs_of(self, rows: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """``(position in rows, reference index)`` of the pairs of these query rows that
        the pair rules exclude (references never candidates are not listed; duplicates
        may be)."""
        rows = _as_indices(rows, self._device())
        found = [rule.pairs_of(rows) for rule in self._rules]
        if not found:
            empty = torch.zeros(0, dtype=torch.long, device=rows.device)
            return empty, empty
        return torch.cat([f[0] for f in found]), torch.cat([f[1] for f in found])

    def fill(self, scores: torch.Tensor, rows: torch.Tensor | slice, worst: float) -> None:
        """Set the excluded entries of ``scores`` (rows ``rows`` x every reference) to
        ``worst``, in place."""
        position, columns = self.pairs_of(rows)
        scores[position.to(scores.device), columns.to(scores.device)] = worst
        if self.never_candidates is not None:
            scores[:, self.never_candidates.to(scores.device)] = worst

    def fill_tile(self, scores: torch.Tensor, rows: slice, first_column: int, worst: float) -> None:
        """Like :meth:`fill` for the tile of columns ``first_column`` onward. The pairs of
        a row block are found once and kept, sorted by column, while its tiles are walked."""
        position, columns = self._sorted_pairs(rows)
        last_column = first_column + scores.shape[1]
        bounds = torch.tensor([first_column, last_column], device=columns.device)
        low, high = torch.searchsorted(columns, bounds).tolist()
        if high > low:
            scores[position[low:high], columns[low:high] - first_column] = worst
        if self._never_columns is not None:
            low, high = torch.searchsorted(self._never_columns, bounds).tolist()
            if high > low:
                scores[:, self._never_columns[low:high] - first_column] = worst

    def _sorted_pairs(self, rows: slice) -> tuple[torch.Tensor, ...]:
        key = (int(rows.start or 0), int(rows.stop))
        with self._lock:
            found = self._blocks.get(key)
            if found is not None:
                self._blocks.move_to_end(key)
                return found
        position, columns = self.pairs_of(rows)
        columns, order = torch.sort(columns)
        found = (position[order], columns)
        with self._lock:
            self._blocks[key] = found
            while len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        return found

    def excluded_at(self, indices: torch.Tensor) -> torch.Tensor:
        """Boolean ``(num_query, k)``: whether reference ``indices[q, i]`` is excluded for
        query ``q`` (for checking or filtering a backend's answer)."""
        excluded = torch.zeros(indices.shape, dtype=torch.bool, device=indices.device)
        if self.never_candidates is not None:
            excluded |= self.never_candidates.to(indices.device)[indices]
        for rows in self._row_blocks(indices.shape[1]):
            codes = self._codes(rows)
            if len(codes):
                wanted = rows.unsqueeze(1) * self.num_reference + indices[rows]
                place = torch.searchsorted(codes, wanted).clamp_max(len(codes) - 1)
                excluded[rows] |= codes[place] == wanted
        return excluded

    def distinct_pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(query index, reference index)`` of the distinct pairs the pair rules exclude,
        in blocks of query rows."""
        for rows in self._row_blocks(1):
            codes = self._codes(rows)
            yield codes // self.num_reference, codes % self.num_reference

    def with_same_keys(self, query_keys: torch.Tensor, reference_keys: torch.Tensor) -> Exclusion:
        """A copy with one more same-keys rule."""
        copy = self._copy()
        copy._rules = [*self._rules, self._same_key_rule(query_keys, reference_keys)]
        return copy

    def query_rows(self, start: int, stop: int) -> Exclusion:
        """The rules of the query rows ``start:stop`` alone, for a search of that block of
        the query against the same reference (query ``start + q`` becomes row ``q``).

        Example:
            >>> rule = Exclusion(3, 3, pairs=torch.tensor([[2, 1]]))
            >>> [pair.tolist() for pair in rule.query_rows(1, 3).pairs_of(torch.tensor([1]))]
            [[0], [1]]
        """
        rows = range(self.num_query)[start:stop]
        return self.for_queries(torch.arange(rows.start, rows.stop))

    def for_queries(self, rows: torch.Tensor) -> Exclusion:
        """The same rules for a search of the query rows ``rows`` alone, renumbered
        ``0 .. len(rows) - 1`` (e.g. a few chosen queries ranked against the reference).

        Example:
            >>> rule = Exclusion(3, 2, pairs=torch.tensor([[2, 1]]))
            >>> [pair.tolist() for pair in rule.for_queries(torch.tensor([2])).pairs_of(slice(0, 1))]
            [[0], [1]]
        """
        rows = _as_indices(rows, self._device())
        copy = self._copy()
        copy.num_query = len(rows)
        copy._rules = [rule.for_queries(rows) for rule in self._rules]
        copy._start_cache()
        return copy

    def candidates_only(self) -> tuple[Exclusion, torch.Tensor | None]:
        """``(rules, kept)``: the rules over the references that are candidates of some
        query (``reference[kept]``), renumbered, and ``kept``; ``kept`` is None when every
        reference may be a candidate. A search that drops the never-candidates first
        computes no distance to them."""
        flags = self.never_candidates
        if flags is None:
            return self, None
        kept = (~flags).nonzero().flatten()
        position = torch.full((self.num_reference,), -1, dtype=torch.long, device=flags.device)
        position[kept] = torch.arange(len(kept), device=flags.device)
        copy = self._copy()
        copy.num_reference = len(kept)
        copy._rules = [rule.restricted(position) for rule in self._rules]
        copy.never_candidates = None
        copy._start_cache()
        return copy, kept

    def _copy(self) -> Exclusion:
        copy = Exclusion.__new__(Exclusion)
        copy.num_query, copy.num_reference = self.num_query, self.num_reference
        copy._rules, copy.never_candidates = list(self._rules), self.never_candidates
        copy._start_cache()
        return copy

    def _codes(self, rows: torch.Tensor) -> torch.Tensor:
        """Sorted distinct ``query * num_reference + reference`` of the pairs of ``rows``."""
        position, columns = self.pairs_of(rows)
        return torch.unique(rows[position] * self.num_reference + columns)

    def _row_blocks(self, width: int) -> Iterator[torch.Tensor]:
        counts = sum(
            (rule.count_per_query() for rule in self._rules),
            torch.zeros(self.num_query, dtype=torch.long, device=self._device()),
        )
        per_row = max(1, int(counts.max()) if len(counts) else 1) + width
        step = max(1, _PAIRS_BLOCK // per_row)
        for start in range(0, self.num_query, step):
            yield torch.arange(start, min(start + step, self.num_query), device=self._device())

    def _device(self) -> torch.device:
        if self._rules:
            return self._rules[0].query_keys.device
        if self.never_candidates is not None:
            return self.never_candidates.device
        return torch.device("cpu")


def key_pairs(
    first: torch.Tensor, second: torch.Tensor, num_reference: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One integer key per row of ``first`` and of ``second`` (1-D tensors of equal
    length ``num_query + num_reference`` together), equal exactly when both entries are.

    Used to build a same-keys rule over two attributes, e.g. (label, camera).

    Example:
        >>> keys = key_pairs(torch.tensor([1, 1, 2, 1]), torch.tensor([5, 6, 5, 5]), 2)
        >>> [k.tolist() for k in keys]
        [[0, 1], [2, 0]]
        >>> keys[0][0] == keys[1][1], keys[0][1] == keys[1][0]
        (tensor(True), tensor(False))
    """
    if first.shape != second.shape or first.ndim != 1:
        raise InvalidArgumentError(
            "key_pairs needs two 1-D tensors of equal length. "
            f"Got shapes {tuple(first.shape)} and {tuple(second.shape)} instead."
        )
    first_ids = torch.unique(first, return_inverse=True)[1]
    second_ids = torch.unique(second, return_inverse=True)[1]
    keys = first_ids * (int(second_ids.max()) + 1 if len(second_ids) else 1) + second_ids
    split = len(first) - num_reference
    return keys[:split], keys[split:]


def _as_indices(rows: torch.Tensor | slice, device: torch.device) -> torch.Tensor:
    if isinstance(rows, slice):
        return torch.arange(rows.start or 0, rows.stop, device=device)
    return rows.to(device)


def _integer_vector(values: torch.Tensor, param: str, length: int) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise invalid(param, OWNER, "a torch.Tensor", type(values).__name__, InvalidTypeError)
    if values.shape != (length,) or values.is_floating_point() or values.is_complex():
        raise invalid(
            param, OWNER, f"{length} integer keys", f"{values.dtype} {tuple(values.shape)}"
        )
    return values.long()
