"""How the ranks' shards of query and reference form one global query and reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ShardLayout", "exclusive_cumsum"]


def exclusive_cumsum(counts: tuple[int, ...]) -> tuple[int, ...]:
    """``(0, c0, c0 + c1, ...)`` without the grand total."""
    offsets, total = [], 0
    for count in counts:
        offsets.append(total)
        total += count
    return tuple(offsets)


@dataclass(frozen=True)
class ShardLayout:
    """Row counts of every rank's query and reference shard.

    The global query is the concatenation of the query shards in rank order. The global
    reference is the concatenation of the reference shards in rank order, except with
    ``ref_includes_query``: then each rank's query shard is the first rows of its reference
    shard, and the global reference is the global query followed by the remaining rows of
    every reference shard in rank order. So the global query is the first rows of the global
    reference, as the single-process k-NN contract requires, and the query row with global
    index ``i`` is reference row ``i``.
    """

    query_counts: tuple[int, ...]
    reference_counts: tuple[int, ...]
    ref_includes_query: bool

    @property
    def num_query(self) -> int:
        return sum(self.query_counts)

    @property
    def num_reference(self) -> int:
        return sum(self.reference_counts)

    def query_offset(self, rank: int) -> int:
        """Global index of rank ``rank``'s first query row."""
        return exclusive_cumsum(self.query_counts)[rank]

    def reference_ids(self, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global reference index of each row of rank ``rank``'s reference shard."""
        count = self.reference_counts[rank]
        if not self.ref_includes_query:
            start = exclusive_cumsum(self.reference_counts)[rank]
            return torch.arange(start, start + count, device=device)
        own = self.query_counts[rank]
        rest = tuple(r - q for r, q in zip(self.reference_counts, self.query_counts))
        rest_start = self.num_query + exclusive_cumsum(rest)[rank]
        query_start = self.query_offset(rank)
        return torch.cat(
            [
                torch.arange(query_start, query_start + own, device=device),
                torch.arange(rest_start, rest_start + count - own, device=device),
            ]
        )

    def reference_order(self) -> torch.Tensor:
        """For each global reference index, its position in the plain rank-order concatenation.

        ``torch.cat(shards)[layout.reference_order()]`` is the global reference.
        """
        ids = torch.cat([self.reference_ids(rank) for rank in range(len(self.query_counts))])
        order = torch.empty_like(ids)
        order[ids] = torch.arange(len(ids))
        return order

    def block_counts(self, step: int, block_size: int) -> list[int]:
        """Query rows each rank sends in exchange step ``step`` (0 once a shard is done)."""
        start = step * block_size
        return [max(0, min(block_size, count - start)) for count in self.query_counts]

    def num_steps(self, block_size: int) -> int:
        """Exchange steps needed for the largest query shard."""
        return -(-max(self.query_counts, default=0) // block_size)
