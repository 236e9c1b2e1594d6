"""Exclusion rules for a search whose query and reference are sharded across ranks.

A :class:`ShardExclusion` is one rank's part of the rule: keys for its own query and
reference rows (a reference is no candidate of a query with an equal key row, e.g. the
same label *and* camera), the references of its shard that are no query's candidate, and
explicit ``(query, reference)`` pairs in global row numbers. The keys travel with the
query rows; each rank turns the rule into a local
:class:`~pytorch_metric_learning.evaluation.search.exclusion.Exclusion` of one gathered
query block against its reference shard, so no rank holds a dense mask.

Global row numbers are those of :class:`DistributedKNN`: query ``q`` is row ``q`` of the
query shards concatenated in rank order, and reference ``r`` is the global reference index
that DistributedKNN returns (the reference shards in rank order; with
``ref_includes_query``, the global query first, then every rank's other reference rows in
rank order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ..search.exclusion import Exclusion
from ._collectives import Comm, all_gather_ints, all_gather_rows

__all__ = ["ShardExclusion"]

_OWNER = "ShardExclusion"


@dataclass(frozen=True)
class ShardExclusion:
    """This rank's part of the pairs of a sharded search that are not candidates.

    Args:
        query_keys: One integer key (or key row) per query row of this rank, or None.
        reference_keys: One integer key (or key row) per reference row of this rank:
            reference ``j`` is excluded for query ``q`` when their key rows are equal.
            Keys mean the same on every rank. Given together with ``query_keys``.
        pairs: ``(m, 2)`` integer tensor of excluded ``(global query, global reference)``
            pairs. The rule is the union of every rank's pairs (duplicates are harmless):
            pass each query's pairs on its own rank, or the same list on every rank.
        never_candidates: Bool flag per reference row of this rank that is no query's
            candidate (e.g. a junk label).

    Example:
        >>> rule = ShardExclusion(torch.tensor([1, 2]), torch.tensor([2, 2, 1]))
        >>> rule.excludes_nothing
        False
    """

    query_keys: torch.Tensor | None = None
    reference_keys: torch.Tensor | None = None
    pairs: torch.Tensor | None = None
    never_candidates: torch.Tensor | None = None

    @property
    def excludes_nothing(self) -> bool:
        return (
            self.query_keys is None
            and self.pairs is None
            and (self.never_candidates is None or not bool(self.never_candidates.any()))
        )

    def check(self, num_query: int, num_reference: int) -> list[int]:
        """Check the shapes against this rank's shards; return ``[has keys, key width,
        has pairs]`` for the ranks to agree on."""
        if (self.query_keys is None) != (self.reference_keys is None):
            raise invalid(
                "reference_keys" if self.reference_keys is None else "query_keys",
                _OWNER, "keys for both the query and the reference rows (or neither)", None,
            )  # fmt: skip
        width = 0
        if self.query_keys is not None and self.reference_keys is not None:
            width = _check_keys(self.query_keys, "query_keys", num_query)
            if _check_keys(self.reference_keys, "reference_keys", num_reference) != width:
                raise invalid(
                    "reference_keys", _OWNER, f"key rows of width {width} like the query keys",
                    tuple(self.reference_keys.shape),
                )  # fmt: skip
        if self.pairs is not None:
            _check_pairs_shape(self.pairs)
        flags = self.never_candidates
        if flags is not None and (
            not isinstance(flags, torch.Tensor)
            or flags.dtype != torch.bool
            or flags.shape != (num_reference,)
        ):
            got = (
                f"{flags.dtype} {tuple(flags.shape)}" if isinstance(flags, torch.Tensor) else flags
            )
            raise invalid(
                "never_candidates", _OWNER, f"a bool tensor with one flag per reference row "
                f"({num_reference})", got,
            )  # fmt: skip
        return [int(self.query_keys is not None), width, int(self.pairs is not None)]


def _check_keys(keys: torch.Tensor, param: str, length: int) -> int:
    if not isinstance(keys, torch.Tensor):
        raise invalid(param, _OWNER, "a torch.Tensor", type(keys).__name__, InvalidTypeError)
    if (
        keys.ndim not in (1, 2)
        or len(keys) != length
        or keys.is_floating_point()
        or keys.is_complex()
        or keys.dtype == torch.bool
    ):
        raise invalid(
            param, _OWNER, f"an integer tensor with one key (row) per row ({length})",
            f"{keys.dtype} {tuple(keys.shape)}",
        )  # fmt: skip
    return 1 if keys.ndim == 1 else int(keys.shape[1])


def _check_pairs_shape(pairs: torch.Tensor) -> None:
    if not isinstance(pairs, torch.Tensor):
        raise invalid("pairs", _OWNER, "a torch.Tensor", type(pairs).__name__, InvalidTypeError)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.is_floating_point() or pairs.is_complex():
        raise invalid(
            "pairs", _OWNER, "an (m, 2) integer tensor", f"{pairs.dtype} {tuple(pairs.shape)}"
        )


def gather_pairs(comm: Comm, pairs: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The union of every rank's pairs (global numbers), distinct, sorted by query."""
    local = (
        torch.zeros((0, 2), dtype=torch.long, device=device)
        if pairs is None
        else pairs.to(device).long()
    )
    sizes = all_gather_ints(comm, [len(local)], "sharing the excluded pairs (sizes)")[:, 0]
    every = all_gather_rows(comm, local, sizes.tolist(), "sharing the excluded pairs")
    return torch.unique(every.to(device), dim=0)


def check_pair_range(pairs: torch.Tensor, num_query: int, num_reference: int) -> None:
    """Every pair must name a global query row and a global reference row."""
    for column, size, role in ((0, num_query, "query"), (1, num_reference, "reference")):
        values = pairs[:, column]
        if len(values) and (int(values.min()) < 0 or int(values.max()) >= size):
            raise InvalidArgumentError(
                f"The 'pairs' of {_OWNER} must hold global {role} row numbers in "
                f"[0, {size}). Got numbers from {int(values.min())} to {int(values.max())} "
                "instead."
            )


def local_pairs(pairs: torch.Tensor, shard_ids: torch.Tensor) -> torch.Tensor:
    """The pairs whose reference is in this shard, as ``(global query, local reference)``
    sorted by query (``shard_ids``: the sorted global indices of the shard's rows)."""
    if len(shard_ids) == 0 or len(pairs) == 0:
        return pairs.new_zeros((0, 2))
    place = torch.searchsorted(shard_ids, pairs[:, 1].contiguous()).clamp_max(len(shard_ids) - 1)
    mine = shard_ids[place] == pairs[:, 1]
    found = torch.stack([pairs[mine, 0], place[mine]], dim=1)
    order = torch.argsort(found[:, 0], stable=True)
    return found[order]


@dataclass(frozen=True)
class ShardRule:
    """One rank's rule, prepared once: its reference keys and flags and its pairs."""

    query_keys: torch.Tensor | None  # this rank's query keys (2-D rows)
    reference_keys: torch.Tensor | None
    pairs: torch.Tensor  # (global query, local reference), sorted by query
    never_candidates: torch.Tensor | None

    def for_block(
        self, block_ids: torch.Tensor, block_keys: torch.Tensor | None, num_reference: int
    ) -> Exclusion:
        """The local rule of one gathered query block (``block_ids``: sorted global query
        numbers of its rows) against this rank's reference shard."""
        same_keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        if block_keys is not None and self.reference_keys is not None:
            both = torch.cat([block_keys, self.reference_keys])
            ids = torch.unique(both, dim=0, return_inverse=True)[1]
            same_keys.append((ids[: len(block_keys)], ids[len(block_keys) :]))
        pairs = None
        if len(self.pairs) and len(block_ids):
            queries = self.pairs[:, 0].contiguous()
            low = int(torch.searchsorted(queries, block_ids[:1], right=False))
            high = int(torch.searchsorted(queries, block_ids[-1:], right=True))
            chosen = self.pairs[low:high]
            place = torch.searchsorted(block_ids, chosen[:, 0].contiguous())
            inside = block_ids[place.clamp_max(len(block_ids) - 1)] == chosen[:, 0]
            pairs = torch.stack([place[inside], chosen[inside, 1]], dim=1)
        return Exclusion(
            len(block_ids), num_reference, same_keys=same_keys, pairs=pairs,
            never_candidates=self.never_candidates,
        )  # fmt: skip

    @property
    def has_keys(self) -> bool:
        return self.query_keys is not None


def as_rows(keys: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Keys as long rows (a 1-D key becomes a one-column row)."""
    if keys is None:
        return None
    keys = keys.to(device).long()
    return keys.unsqueeze(1) if keys.ndim == 1 else keys
