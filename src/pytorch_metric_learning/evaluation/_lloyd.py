"""The one k-means of the library: sampling, k-means++ seeding and Lloyd's iterations.

Every step that needs the rows of more than one process goes through a :class:`Reducer`:
``sum`` adds tensors over the processes and ``farthest_rows`` picks rows for empty
clusters. :class:`LocalReducer` is the one-process driver (``TorchKMeans``); the
distributed driver (``DistributedKMeans``) all-reduces. Centres are therefore the same on
every process, and one process of a group computes exactly what ``TorchKMeans`` does.

Training, as faiss does, uses at most ``max_points_per_centroid`` rows per cluster (a
uniform sample drawn from global row numbers, so it does not depend on the sharding); one
assignment pass over every row then labels them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .._validation import check_positive_int, invalid
from ..errors import InvalidTypeError

# Elements of one (rows, clusters) distance block.
_BLOCK_ELEMENTS = 1 << 23
# Elements of x summed per cluster in the input's precision before adding in float64.
_SUM_BLOCK_ELEMENTS = 1 << 20
# Keep Hamerly's bounds while at most this fraction of the rows needs measuring.
_KEEP_BOUNDS = 0.9


class Reducer(Protocol):
    """How the rows of all processes are combined (one process: nothing to combine)."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` added over every process (float64 or int64)."""

    def local_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """This process's rows among the sorted global row numbers ``rows``."""

    def gathered_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The rows ``rows`` (sorted global row numbers) of all processes, on every one."""

    def farthest_rows(self, count: int, distance: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The ``count`` rows of all processes with the largest ``distance`` (ties: lower
        global row number)."""


class LocalReducer:
    """The reducer of a single process: sums are the local values."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def local_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x if len(rows) == len(x) else x[rows.to(x.device)]

    def gathered_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.local_rows(x, rows)

    def farthest_rows(self, count: int, distance: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x[farthest_local(distance, count)]


@dataclass(frozen=True)
class Options:
    """The options ``TorchKMeans`` and ``DistributedKMeans`` share."""

    n_init: int
    max_iter: int
    tol: float
    init_size: int | None
    max_points_per_centroid: int | None


def checked_options(
    owner: str,
    n_init: int,
    max_iter: int,
    tol: float,
    init_size: int | None,
    max_points_per_centroid: int | None,
) -> Options:
    """Validate the shared options of the k-means drivers, naming ``owner`` in errors."""
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
        raise invalid("tol", owner, "a non-negative float", tol)
    if init_size is not None:
        init_size = check_positive_int(init_size, "init_size", owner)
    if max_points_per_centroid is not None:
        max_points_per_centroid = check_positive_int(
            max_points_per_centroid, "max_points_per_centroid", owner
        )
    return Options(
        check_positive_int(n_init, "n_init", owner),
        check_positive_int(max_iter, "max_iter", owner),
        float(tol),
        init_size,
        max_points_per_centroid,
    )


def check_seed(seed: int | None, owner: str) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise invalid("seed", owner, "an int or None", seed, InvalidTypeError)
    return seed


def kmeans(
    x: torch.Tensor,
    total: int,
    num_clusters: int,
    options: Options,
    generator: torch.Generator,
    reducer: Reducer,
) -> torch.Tensor:
    """Cluster the ``total`` rows of every process; return this process's labels.

    Each restart trains on a sample of at most ``max_points_per_centroid * num_clusters``
    rows; the centres of the restart with the lowest inertia (on its sample) then label
    every row in one assignment pass (no pass when the sample is every row).
    """
    sizes = plan_sizes(total, num_clusters, options.max_points_per_centroid, options.init_size)
    restarts = (
        _restart(x, sizes, num_clusters, options, generator, reducer) for _ in range(options.n_init)
    )
    _, labels, centers = min(restarts, key=lambda result: result[0])  # the first on ties
    return labels if sizes.train == total else nearest(x, centers)[0]


def _restart(
    x: torch.Tensor,
    sizes: Sizes,
    num_clusters: int,
    options: Options,
    generator: torch.Generator,
    reducer: Reducer,
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One seeding and Lloyd run: (inertia on its training rows, their labels, centres)."""
    train_rows, seed_rows = draw_rows(sizes, generator)
    train = reducer.local_rows(x, train_rows)
    centers = kmeans_plus_plus(reducer.gathered_rows(x, seed_rows), num_clusters, generator)
    threshold = options.tol * total_variance(train, reducer)
    labels, centers = lloyd(train, centers, options.max_iter, threshold, reducer)
    return float(reducer.sum(inertia(train, centers, labels))), labels, centers


@dataclass(frozen=True)
class Sizes:
    """How many rows the training and the seeding of one restart use."""

    total: int
    train: int
    seed: int


def plan_sizes(
    total: int, num_clusters: int, max_points_per_centroid: int | None, init_size: int | None
) -> Sizes:
    """Training rows: at most ``max_points_per_centroid`` per cluster; seeding rows: at
    most ``init_size`` of those (never fewer than ``num_clusters``)."""
    train = total
    if max_points_per_centroid is not None:
        train = min(total, max_points_per_centroid * num_clusters)
    seed = train if init_size is None else min(train, max(init_size, num_clusters))
    return Sizes(total, train, seed)


def draw_rows(sizes: Sizes, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted global row numbers for training and for seeding (a subset of the training
    rows), drawn with a CPU generator so that every device and process draws the same."""
    if sizes.train == sizes.total and sizes.seed == sizes.total:
        every = torch.arange(sizes.total)
        return every, every
    order = torch.randperm(sizes.total, generator=generator)
    return order[: sizes.train].sort().values, order[: sizes.seed].sort().values


def kmeans_plus_plus(
    x: torch.Tensor, num_clusters: int, generator: torch.Generator
) -> torch.Tensor:
    """Pick centres one at a time, each row with probability proportional to D(x)^2.

    The random numbers come from the CPU ``generator`` and the rows' squared distances
    from ``|x|^2 - 2 x.c + |c|^2``, so equal inputs and generator states give equal
    centres on every process.
    """
    first = int(torch.randint(len(x), (1,), generator=generator))
    draws = torch.rand(num_clusters, generator=generator, dtype=torch.float64).tolist()
    centers = torch.empty((num_clusters, x.shape[1]), dtype=x.dtype, device=x.device)
    x_sq = (x * x).sum(dim=1)
    centers[0] = x[first]
    closest = (x_sq - 2 * (x @ centers[0]) + x_sq[first]).clamp_(min=0)
    for i in range(1, num_clusters):
        cumulative = closest.cumsum(0, dtype=torch.float64)
        total = float(cumulative[-1])
        if total > 0:  # a row with probability proportional to its D(x)^2
            target = torch.tensor([draws[i] * total], dtype=torch.float64, device=x.device)
            chosen = min(int(torch.searchsorted(cumulative, target, right=True)), len(x) - 1)
        else:  # every row is already a centre
            chosen = int(draws[i] * len(x))
        centers[i] = x[chosen]
        distance = (x_sq - 2 * (x @ centers[i]) + x_sq[chosen]).clamp_(min=0)
        torch.minimum(closest, distance, out=closest)
    return centers


def total_variance(x: torch.Tensor, reducer: Reducer) -> float:
    """Sum over dimensions of the variance of every process's rows together."""
    moments = torch.cat(
        [
            torch.tensor([float(len(x))], dtype=torch.float64, device=x.device),
            x.sum(dim=0, dtype=torch.float64),
            (x * x).sum(dim=0, dtype=torch.float64),
        ]
    )
    moments = reducer.sum(moments)
    count, dims = float(moments[0]), x.shape[1]
    if count <= 1:
        return 0.0
    mean = moments[1 : 1 + dims] / count
    return float((moments[1 + dims :] / count - mean * mean).sum().clamp(min=0))


def lloyd(
    x: torch.Tensor, centers: torch.Tensor, max_iter: int, threshold: float, reducer: Reducer
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's iterations with Hamerly's bounds, which skip rows whose centre cannot change.

    Each row keeps an upper bound on its distance to its centre and a lower bound on its
    distance to every other centre; after the centres move, only rows whose bounds no
    longer prove the assignment are measured again (a GEMM on those rows only). When the
    bounds stop pruning (overlapping clusters), plain passes, which are cheaper, take over.
    Stops when no row changes centre or the centres move less than ``threshold`` (sum of
    squared shifts). Returns the labels of the rows and the centres they are nearest to.
    """
    labels, upper, lower = nearest_two(x, centers)
    bounded = True
    for _ in range(max_iter):
        new_centers = update_centers(x, labels, upper, centers, reducer)
        moved = (new_centers - centers).norm(dim=1)
        centers = new_centers
        if bounded:
            upper += moved[labels]
            lower -= _largest_other(moved, labels)
            changed, looked = _reassign(x, centers, labels, upper, lower)
        else:
            new_labels, upper = nearest(x, centers)
            changed, looked = int((new_labels != labels).sum()), len(x)
            labels = new_labels
        counts = reducer.sum(torch.tensor([changed, looked, len(x)], device=x.device))
        changed, looked, rows = (int(value) for value in counts)
        bounded = bounded and looked <= _KEEP_BOUNDS * rows
        if changed == 0 or float((moved * moved).sum()) <= threshold:
            break
    return labels, centers


def update_centers(
    x: torch.Tensor,
    labels: torch.Tensor,
    distance: torch.Tensor,
    centers: torch.Tensor,
    reducer: Reducer,
) -> torch.Tensor:
    """Means of the clusters; an empty cluster moves to the row farthest from its centre.

    Each block of rows is summed per cluster in the input's precision (``index_add_`` is
    many times slower in float64 on CPU), and the blocks' sums are added in float64.
    """
    num_clusters, dims = centers.shape
    packed = torch.zeros(num_clusters * (dims + 1), dtype=torch.float64, device=x.device)
    sums = packed[: num_clusters * dims].view(num_clusters, dims)
    rows = max(1, _SUM_BLOCK_ELEMENTS // max(1, dims))
    for start in range(0, len(x), rows):
        block = torch.zeros_like(centers).index_add_(
            0, labels[start : start + rows], x[start : start + rows]
        )
        sums += block
    packed[num_clusters * dims :] = torch.bincount(labels, minlength=num_clusters)
    packed = reducer.sum(packed)
    sums, counts = packed[: num_clusters * dims].view(num_clusters, dims), packed[-num_clusters:]
    new_centers = (sums / counts.clamp(min=1).unsqueeze(1)).to(centers.dtype)
    empty = torch.nonzero(counts == 0).flatten()
    if len(empty):
        new_centers[empty] = reducer.farthest_rows(len(empty), distance, x).to(centers.dtype)
    return new_centers


def farthest_local(distance: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` largest distances, largest first, ties to the lower index."""
    return torch.argsort(distance, descending=True, stable=True)[:count]


def inertia(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of squared distances of the rows to their centres (float64, one element)."""
    rows = max(1, _BLOCK_ELEMENTS // max(1, x.shape[1]))
    total = torch.zeros(1, dtype=torch.float64, device=x.device)
    for start in range(0, len(x), rows):
        diff = x[start : start + rows] - centers[labels[start : start + rows]]
        total += (diff * diff).sum(dtype=torch.float64)
    return total


def _largest_other(moved: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """For each row, the largest shift among the centres other than its own."""
    if len(moved) == 1:
        return moved.new_zeros(len(labels))
    top = torch.topk(moved, 2)
    return torch.where(labels == top.indices[0], top.values[1], top.values[0])


def _reassign(
    x: torch.Tensor,
    centers: torch.Tensor,
    labels: torch.Tensor,
    upper: torch.Tensor,
    lower: torch.Tensor,
) -> tuple[int, int]:
    """Update, in place, the rows whose bounds allow another centre.

    Returns how many rows changed centre and how many had to be measured.
    """
    half_gap = 0.5 * nearest_two(centers, centers)[2]  # to the nearest other centre
    bound = torch.maximum(lower, half_gap[labels])
    check = torch.nonzero(upper > bound).flatten()
    if 2 * len(check) > len(x):  # most rows need a look: one pass without gathering them
        new_labels, upper[:], lower[:] = nearest_two(x, centers)
        changed = int((new_labels != labels).sum())
        labels.copy_(new_labels)
        return changed, len(check)
    if len(check):
        upper[check] = (x[check] - centers[labels[check]]).norm(dim=1)
        check = check[upper[check] > bound[check]]
    if len(check) == 0:
        return 0, 0
    new_labels, upper[check], lower[check] = nearest_two(x[check], centers)
    changed = int((new_labels != labels[check]).sum())
    labels[check] = new_labels
    return changed, len(check)


def nearest(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centre of every row and the distance to it, in row blocks."""
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    distance = torch.empty(len(x), dtype=x.dtype, device=x.device)
    centers_sq = (centers * centers).sum(dim=1)
    rows = max(1, _BLOCK_ELEMENTS // len(centers))
    for start in range(0, len(x), rows):
        block = x[start : start + rows]
        values, indices = torch.addmm(centers_sq, block, centers.T, alpha=-2).min(dim=1)
        labels[start : start + rows] = indices
        squared = values + (block * block).sum(dim=1)
        distance[start : start + rows] = squared.clamp_(min=0).sqrt_()
    return labels, distance


def nearest_two(
    x: torch.Tensor, centers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest centre of every row, an upper bound on the distance to it and a lower bound
    on the distance to the second nearest (``inf`` with one centre), in row blocks.

    Distances come from ``|x|^2 - 2 x.c + |c|^2`` in the input's precision; the bounds are
    widened by that expansion's rounding error so that they stay bounds.
    """
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    upper = torch.empty(len(x), dtype=x.dtype, device=x.device)
    lower = torch.full((len(x),), float("inf"), dtype=x.dtype, device=x.device)
    centers_sq = (centers * centers).sum(dim=1)
    slack = 16 * torch.finfo(x.dtype).eps * x.shape[1] ** 0.5
    rows = max(1, _BLOCK_ELEMENTS // len(centers))
    for start in range(0, len(x), rows):
        block = x[start : start + rows]
        block_sq = (block * block).sum(dim=1, keepdim=True)
        scores = torch.addmm(centers_sq, block, centers.T, alpha=-2)
        first, indices = scores.min(dim=1)  # two passes of min beat topk(2) on CPU
        error = slack * (block_sq[:, 0] + centers_sq.max())
        labels[start : start + rows] = indices
        upper[start : start + rows] = (first + block_sq[:, 0] + error).clamp_(min=0).sqrt_()
        if len(centers) > 1:
            second = scores.scatter_(1, indices.unsqueeze(1), float("inf")).amin(dim=1)
            lower[start : start + rows] = (second + block_sq[:, 0] - error).clamp_(min=0).sqrt_()
    return labels, upper, lower
