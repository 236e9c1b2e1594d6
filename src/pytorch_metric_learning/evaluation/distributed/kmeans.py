"""Lloyd's k-means over rows sharded across the ranks of a ``torch.distributed`` group.

The algorithm is ``TorchKMeans``'s (``evaluation.clustering._lloyd``); this module is its all-reduce
driver.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from ..._validation import check_embeddings, check_positive_int
from ...errors import InvalidArgumentError
from ..clustering._lloyd import (
    Options,
    check_seed,
    checked_options,
    farthest_local,
    kmeans,
    take_rows,
)
from ._collectives import (
    Comm,
    agree,
    all_gather_ints,
    all_gather_rows,
    all_reduce_max,
    all_reduce_sum,
    broadcast,
    resolve_comm,
    resolve_timeout,
)
from ._layout import exclusive_cumsum

__all__ = ["DistributedKMeans"]

_OWNER = "DistributedKMeans"


class DistributedKMeans:
    """k-means where every rank holds a shard of the rows; each rank gets its rows' clusters.

    The algorithm is :class:`~pytorch_metric_learning.evaluation.TorchKMeans`'s, with the
    same options and random draws: on a group of one rank it returns exactly what
    ``TorchKMeans`` does. All ranks draw the same global row numbers (a generator seeded
    alike) for training (at most ``max_points_per_centroid`` per cluster) and for seeding
    (at most ``init_size`` of those, gathered on every rank for greedy k-means++). Each Lloyd
    iteration all-reduces the per-cluster sums and counts (``num_clusters * (dims + 1)``
    float64 values) and the number of changed assignments, so every rank holds the same
    centres. An empty cluster moves to the row farthest from its centre among all ranks.

    Args:
        n_init: Restarts from different seedings; the lowest global inertia wins.
        max_iter: Most Lloyd iterations per restart.
        tol: Stop when the centres move less than ``tol`` times the data's total variance
            (squared Euclidean), or when no assignment changes on any rank.
        seed: Seed shared by every rank; ``None`` uses one drawn on rank 0.
        init_size: Most rows gathered for seeding (``None``: every training row, on every
            rank); 2048 by default, as ``TorchKMeans``.
        max_points_per_centroid: Most training rows per cluster (``None``: every row); one
            assignment pass then labels every row.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective; ``None`` uses the
            group's timeout.

    Example:
        >>> import os, tempfile
        >>> import torch.distributed as dist
        >>> path = os.path.join(tempfile.mkdtemp(), "init")
        >>> dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
        >>> x = torch.tensor([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.1, 5.0]])
        >>> labels = DistributedKMeans()(x, 2)
        >>> bool(labels[0] == labels[1]) and bool(labels[2] == labels[3] != labels[0])
        True
        >>> dist.destroy_process_group()
    """

    def __init__(
        self, n_init: int = 1, max_iter: int = 20, tol: float = 1e-4, seed: int | None = 0,
        init_size: int | None = 2048, max_points_per_centroid: int | None = 256,
        *, group: Any = None, timeout: float | timedelta | None = None,
    ) -> None:  # fmt: skip
        options = checked_options(_OWNER, n_init, max_iter, tol, init_size, max_points_per_centroid)
        self.n_init, self.max_iter, self.tol = options.n_init, options.max_iter, options.tol
        self.init_size = options.init_size
        self.max_points_per_centroid = options.max_points_per_centroid
        self.seed = check_seed(seed, _OWNER)
        self.group = group
        self.timeout = resolve_timeout(timeout, _OWNER)

    def __repr__(self) -> str:
        return (
            f"DistributedKMeans(n_init={self.n_init}, max_iter={self.max_iter}, "
            f"tol={self.tol}, seed={self.seed}, "
            f"init_size={self.init_size}, "
            f"max_points_per_centroid={self.max_points_per_centroid})"
        )

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, num_clusters: int) -> torch.Tensor:
        """Cluster every rank's rows together; return this rank's cluster ids (``torch.long``).

        Every rank of the group must call it with the same ``num_clusters``.
        """
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        comm = resolve_comm(self.group, self.timeout, device)
        counts, num_clusters = self._plan(comm, x, num_clusters)
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        generator = torch.Generator().manual_seed(self._shared_seed(comm))
        options = Options(
            self.n_init, self.max_iter, self.tol, self.init_size, self.max_points_per_centroid
        )
        return kmeans(x, sum(counts), num_clusters, options, generator, _AllReduce(comm, counts))

    def _plan(self, comm: Comm, x: Any, num_clusters: Any) -> tuple[list[int], int]:
        """Check the inputs on every rank; return every rank's row count and ``num_clusters``."""
        error, meta = None, [0, 0, 0]
        try:
            check_embeddings(x, "x", _OWNER)
            meta = [len(x), x.shape[1], check_positive_int(num_clusters, "num_clusters", _OWNER)]
        except Exception as exc:
            error = exc
        table = agree(comm, error, "checking the inputs of DistributedKMeans", meta)
        for column, name in ((1, "number of columns of 'x'"), (2, "'num_clusters'")):
            values = table[:, column].tolist()
            if len(set(values)) > 1:
                raise InvalidArgumentError(
                    f"The {name} of {_OWNER} must be the same on every rank. "
                    f"Got {values} (by rank) instead."
                )
        counts, clusters = table[:, 0].tolist(), int(table[0, 2])
        if clusters > sum(counts):
            raise InvalidArgumentError(
                f"The 'num_clusters' parameter of {_OWNER} must be at most the number of rows "
                f"on all ranks ({sum(counts)}). Got {clusters} instead."
            )
        return counts, clusters

    def _shared_seed(self, comm: Comm) -> int:
        if self.seed is not None:
            return self.seed
        drawn = torch.randint(0, 2**62, (1,))
        return int(broadcast(comm, drawn, 0, "sharing the k-means seed"))


class _AllReduce:
    """The k-means reducer of a process group: this rank holds rows ``offset`` onwards."""

    def __init__(self, comm: Comm, counts: list[int]) -> None:
        self.comm, self.counts = comm, counts
        self.offset = exclusive_cumsum(tuple(counts))[comm.rank]

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(self.comm, values, "reducing the k-means sums")

    def largest(self, value: float) -> float:
        found = torch.tensor([value], dtype=torch.float64)
        return float(all_reduce_max(self.comm, found, "finding the largest magnitude"))

    def local_positions(self, rows: torch.Tensor, count: int) -> torch.Tensor:
        return rows[(rows >= self.offset) & (rows < self.offset + count)] - self.offset

    def gathered_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        bounds = torch.tensor(exclusive_cumsum(tuple(self.counts))[1:] + (sum(self.counts),))
        per_rank = torch.bucketize(rows, bounds, right=True).bincount(minlength=len(self.counts))
        local = take_rows(x, self.local_positions(rows, len(x)))
        gathered = all_gather_rows(self.comm, local, per_rank.tolist(), "gathering seeding rows")
        return gathered.to(x.device)

    def farthest_rows(self, count: int, distance: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The ``count`` rows of all ranks farthest from their centres (ties: lower index)."""
        local = farthest_local(distance, count)
        sizes = all_gather_ints(self.comm, [len(local)], "counting far rows")[:, 0].tolist()
        rows = torch.cat(
            [distance[local].to(torch.float64).unsqueeze(1), x[local].to(torch.float64)], dim=1
        )
        gathered = all_gather_rows(self.comm, rows, sizes, "gathering far rows for empty clusters")
        # In rank order, each rank's rows in row order: a stable sort keeps ties that way.
        order = torch.argsort(gathered[:, 0], descending=True, stable=True)[:count]
        return gathered[order, 1:].to(x.device, x.dtype)
