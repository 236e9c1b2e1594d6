"""Lloyd's k-means over rows sharded across the ranks of a ``torch.distributed`` group."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from ..._validation import check_embeddings, check_positive_int, invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ._collectives import (
    Comm,
    agree,
    all_gather_rows,
    all_reduce_sum,
    broadcast,
    resolve_comm,
    resolve_timeout,
)
from ._layout import exclusive_cumsum

__all__ = ["DistributedKMeans"]

_OWNER = "DistributedKMeans"
# Elements of one (rows, clusters) distance block.
_BLOCK_ELEMENTS = 1 << 23


class DistributedKMeans:
    """k-means where every rank holds a shard of the rows; each rank gets its rows' clusters.

    Seeding is identical on every rank without a broadcast of centres: all ranks draw the
    same random subset of at most ``init_size`` global rows (a generator seeded alike), gather
    it, and run k-means++ on it with the same generator. Each Lloyd iteration all-reduces the
    per-cluster sums and counts (one collective of ``num_clusters * (dims + 1) + 2`` float64
    values), so every rank holds the same centres. An empty cluster moves to the row
    farthest from its centre among all ranks.

    Args:
        n_init: Restarts from different seedings; the lowest global inertia wins.
        max_iter: Most Lloyd iterations per restart.
        tol: Stop when the centres move less than ``tol`` times the data's total variance
            (squared Euclidean), or when no assignment changes on any rank.
        seed: Seed shared by every rank; ``None`` uses one drawn on rank 0.
        init_size: Most rows gathered for seeding (``None``: every row, on every rank).
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
        self,
        n_init: int = 1,
        max_iter: int = 50,
        tol: float = 1e-4,
        seed: int | None = 0,
        init_size: int | None = 16384,
        *,
        group: Any = None,
        timeout: float | timedelta | None = None,
    ) -> None:
        self.n_init = check_positive_int(n_init, "n_init", _OWNER)
        self.max_iter = check_positive_int(max_iter, "max_iter", _OWNER)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise invalid("tol", _OWNER, "a non-negative float", tol)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise invalid("seed", _OWNER, "an int or None", seed, InvalidTypeError)
        if init_size is not None:
            init_size = check_positive_int(init_size, "init_size", _OWNER)
        self.tol = float(tol)
        self.seed = seed
        self.init_size = init_size
        self.group = group
        self.timeout = resolve_timeout(timeout, _OWNER)

    def __repr__(self) -> str:
        return (
            f"DistributedKMeans(n_init={self.n_init}, max_iter={self.max_iter}, "
            f"tol={self.tol}, seed={self.seed}, init_size={self.init_size})"
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
        threshold = self.tol * _global_variance(comm, x, sum(counts))
        run = _Run(comm, x, counts, num_clusters, threshold)
        best_labels, best_inertia = run.restart(self._seeds(run, generator), self.max_iter)
        for _ in range(self.n_init - 1):
            labels, inertia = run.restart(self._seeds(run, generator), self.max_iter)
            if inertia < best_inertia:
                best_labels, best_inertia = labels, inertia
        return best_labels

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

    def _seeds(self, run: _Run, generator: torch.Generator) -> torch.Tensor:
        """k-means++ centres from the same gathered sample of rows on every rank."""
        sample = run.gather_sample(self.init_size, generator)
        centers = kmeans_plus_plus(sample.cpu(), run.num_clusters, generator)
        return centers.to(run.x.device, run.x.dtype)


class _Run:
    """The state one clustering call shares between its restarts."""

    def __init__(
        self, comm: Comm, x: torch.Tensor, counts: list[int], num_clusters: int, threshold: float
    ) -> None:
        self.comm, self.x, self.counts = comm, x, counts
        self.num_clusters, self.threshold = num_clusters, threshold
        self.offset = exclusive_cumsum(tuple(counts))[comm.rank]

    def gather_sample(self, size: int | None, generator: torch.Generator) -> torch.Tensor:
        """The same uniformly drawn global rows, in global order, on every rank."""
        total = sum(self.counts)
        picked = torch.arange(total)
        if size is not None and size < total:
            picked = torch.randperm(total, generator=generator)[: max(size, self.num_clusters)]
            picked = picked.sort().values
        bounds = torch.tensor(exclusive_cumsum(tuple(self.counts)) + (total,))
        per_rank = torch.bucketize(picked, bounds[1:], right=True).bincount(
            minlength=len(self.counts)
        )
        mine = picked[(picked >= self.offset) & (picked < self.offset + len(self.x))]
        rows = self.x[(mine - self.offset).to(self.x.device)]
        return all_gather_rows(self.comm, rows, per_rank.tolist(), "gathering the seeding rows")

    def restart(self, centers: torch.Tensor, max_iter: int) -> tuple[torch.Tensor, float]:
        """Lloyd's iterations from ``centers``; return this rank's labels and global inertia."""
        labels, min_dist = assign(self.x, centers)
        previous = None
        for _ in range(max_iter):
            sums, sizes, changed = self._reduce(labels, previous)
            if changed == 0:
                break
            new_centers = self._update(sums, sizes, centers, min_dist)
            shift = float(((new_centers - centers) ** 2).sum())
            centers, previous = new_centers, labels
            labels, min_dist = assign(self.x, centers)
            if shift <= self.threshold:
                break
        inertia = all_reduce_sum(
            self.comm, min_dist.sum(dtype=torch.float64).reshape(1), "summing the inertia"
        )
        return labels, float(inertia)

    def _reduce(
        self, labels: torch.Tensor, previous: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Global per-cluster sums and sizes, and how many labels changed on all ranks."""
        k, dims = self.num_clusters, self.x.shape[1]
        packed = torch.zeros(k * (dims + 1) + 1, dtype=torch.float64, device=self.x.device)
        sums = packed[: k * dims].view(k, dims)
        sums.index_add_(0, labels, self.x.to(torch.float64))
        packed[k * dims : k * (dims + 1)] = torch.bincount(labels, minlength=k).double()
        packed[-1] = 1.0 if previous is None else float((labels != previous).sum())
        packed = all_reduce_sum(self.comm, packed, "reducing the k-means cluster sums")
        return packed[: k * dims].view(k, dims), packed[k * dims : k * (dims + 1)], int(packed[-1])

    def _update(
        self, sums: torch.Tensor, sizes: torch.Tensor, centers: torch.Tensor, min_dist: torch.Tensor
    ) -> torch.Tensor:
        """Cluster means; empty clusters move to the globally farthest rows."""
        new_centers = (sums / sizes.clamp(min=1).unsqueeze(1)).to(centers.dtype)
        empty = torch.nonzero(sizes == 0).flatten()
        if len(empty):
            new_centers[empty] = self._farthest_rows(len(empty), min_dist)
        return new_centers

    def _farthest_rows(self, count: int, min_dist: torch.Tensor) -> torch.Tensor:
        """The ``count`` rows of all ranks farthest from their centres (ties: lower index)."""
        local = torch.topk(min_dist, min(count, len(min_dist))).indices
        rows = torch.cat(
            [
                min_dist[local].to(torch.float64).unsqueeze(1),
                (local + self.offset).to(torch.float64).unsqueeze(1),
                self.x[local].to(torch.float64),
            ],
            dim=1,
        )
        sizes = [min(count, n) for n in self.counts]
        gathered = all_gather_rows(self.comm, rows, sizes, "gathering far rows for empty clusters")
        order = torch.argsort(gathered[:, 1], stable=True)
        gathered = gathered[order]
        order = torch.argsort(gathered[:, 0], descending=True, stable=True)[:count]
        return gathered[order, 2:].to(self.x.device, self.x.dtype)


def kmeans_plus_plus(
    x: torch.Tensor, num_clusters: int, generator: torch.Generator
) -> torch.Tensor:
    """Pick ``num_clusters`` rows of ``x`` one at a time, each with probability ~ D(x)^2.

    Deterministic for a given generator state, so every rank seeding from the same rows
    and generator picks the same centres.

    Example:
        >>> x = torch.tensor([[0.0], [0.1], [9.0]])
        >>> centers = kmeans_plus_plus(x, 3, torch.Generator().manual_seed(0))
        >>> sorted(centers.flatten().tolist()) == sorted(x.flatten().tolist())
        True
    """
    centers = torch.empty((num_clusters, x.shape[1]), dtype=x.dtype, device=x.device)
    first = int(torch.randint(len(x), (1,), generator=generator, device=x.device))
    centers[0] = x[first]
    closest = ((x - x[first]) ** 2).sum(dim=1)
    for i in range(1, num_clusters):
        weights = closest if float(closest.sum()) > 0 else torch.ones_like(closest)
        chosen = int(torch.multinomial(weights.double(), 1, generator=generator))
        centers[i] = x[chosen]
        torch.minimum(closest, ((x - x[chosen]) ** 2).sum(dim=1), out=closest)
    return centers


def assign(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centre of every row and the squared distance to it, in row blocks.

    Example:
        >>> assign(torch.tensor([[0.0], [4.0]]), torch.tensor([[1.0], [5.0]]))[0].tolist()
        [0, 1]
    """
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    min_dist = torch.empty(len(x), dtype=x.dtype, device=x.device)
    centers_sq = (centers * centers).sum(dim=1)
    rows = max(1, _BLOCK_ELEMENTS // len(centers))
    for start in range(0, len(x), rows):
        block = x[start : start + rows]
        scores = torch.addmm(centers_sq, block, centers.T, alpha=-2)
        values, indices = scores.min(dim=1)
        labels[start : start + rows] = indices
        min_dist[start : start + rows] = (values + (block * block).sum(dim=1)).clamp_(min=0)
    return labels, min_dist


def _global_variance(comm: Comm, x: torch.Tensor, total: int) -> float:
    """Total variance (sum over dimensions) of every rank's rows together."""
    x64 = x.to(torch.float64)
    moments = torch.cat([x64.sum(dim=0), (x64 * x64).sum(dim=0)])
    moments = all_reduce_sum(comm, moments, "summing the data's moments")
    if total <= 1:
        return 0.0
    mean = moments[: x.shape[1]] / total
    return float((moments[x.shape[1] :] / total - mean * mean).sum().clamp(min=0))
