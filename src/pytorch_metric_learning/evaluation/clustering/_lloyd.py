"""The one k-means of the library: sampling, k-means++ seeding and Lloyd's iterations.

Every step that needs the rows of more than one process goes through a :class:`Reducer`:
``sum`` adds tensors over the processes and ``farthest_rows`` picks rows for empty
clusters. :class:`LocalReducer` is the one-process driver (``TorchKMeans``); the
distributed driver (``DistributedKMeans``) all-reduces. Centres are therefore the same on
every process, and one process of a group computes exactly what ``TorchKMeans`` does.

Training, as faiss does, uses at most ``max_points_per_centroid`` rows per cluster (a
uniform sample drawn from global row numbers, so it does not depend on the sharding); one
assignment pass then labels the rows outside the sample. Seeding is greedy k-means++;
Lloyd's iterations measure only the rows whose bounds do not prove their centre
(``lloyd``), and the nearest-centre kernels live in ``_lloyd_assign``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from ..._validation import check_positive_int, invalid
from ...errors import InvalidTypeError
from ..search._rescale import in_float_range, largest_magnitude
from ._lloyd_assign import nearest, nearest_other, nearest_two

# Elements of x summed (per cluster) in the input's precision before adding in float64.
_SUM_BLOCK_ELEMENTS = 1 << 20
# One centre in this many (those that moved most) is measured against every row.
_MOVERS_PER = 32
# Seeding rows per cluster from which k-means++ draws several candidates per step.
_GREEDY_ROWS = 4
# Measure every row in one pass when more than this fraction of them needs measuring.
_FULL_PASS = 0.5


class Reducer(Protocol):
    """How the rows of all processes are combined (one process: nothing to combine)."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` added over every process (float64 or int64)."""

    def local_positions(self, rows: torch.Tensor, count: int) -> torch.Tensor:
        """Where this process's rows among the sorted global row numbers ``rows`` are in its
        ``count`` rows."""

    def gathered_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The rows ``rows`` (sorted global row numbers) of all processes, on every one."""

    def farthest_rows(self, count: int, distance: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The ``count`` rows of all processes with the largest ``distance`` (ties: lower
        global row number)."""

    def largest(self, value: float) -> float:
        """The largest of every process's ``value``."""


class LocalReducer:
    """The reducer of a single process: sums are the local values."""

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def local_positions(self, rows: torch.Tensor, count: int) -> torch.Tensor:
        return rows

    def gathered_rows(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return take_rows(x, rows)

    def farthest_rows(self, count: int, distance: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x[farthest_local(distance, count)]

    def largest(self, value: float) -> float:
        return value


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
    rows; the restart with the lowest inertia (on its sample; not computed for a single
    restart) wins, and one assignment pass labels the rows outside its sample.
    """
    sizes = plan_sizes(total, num_clusters, options.max_points_per_centroid, options.init_size)
    x = in_float_range(x, reducer.largest(largest_magnitude(x)))

    def restart() -> Run:
        return _restart(x, sizes, num_clusters, options, generator, reducer)

    run = restart()
    if options.n_init > 1:  # the lowest inertia wins, the first on ties
        best = float(reducer.sum(inertia(run.train, run.centers, run.labels)))
        for _ in range(options.n_init - 1):
            other = restart()
            score = float(reducer.sum(inertia(other.train, other.centers, other.labels)))
            if score < best:
                best, run = score, other
    return run.labels if sizes.train == total else label_every_row(x, run)


@dataclass(frozen=True)
class Run:
    """One restart's result: its training rows (``positions`` in ``x``), their labels
    and the centres they are nearest to."""

    positions: torch.Tensor
    train: torch.Tensor
    labels: torch.Tensor
    centers: torch.Tensor


def _restart(
    x: torch.Tensor,
    sizes: Sizes,
    num_clusters: int,
    options: Options,
    generator: torch.Generator,
    reducer: Reducer,
) -> Run:
    """One seeding and Lloyd run on its own training sample."""
    train_rows, seed_rows = draw_rows(sizes, generator)
    positions = reducer.local_positions(train_rows, len(x)).to(x.device)
    train = take_rows(x, positions)
    centers = kmeans_plus_plus(reducer.gathered_rows(x, seed_rows), num_clusters, generator)
    threshold = options.tol * total_variance(train, centers[0], reducer)
    labels, centers = lloyd(train, centers, options.max_iter, threshold, reducer)
    return Run(positions, train, labels, centers)


def label_every_row(x: torch.Tensor, run: Run) -> torch.Tensor:
    """Labels of every row: the training rows keep theirs (their nearest centres already);
    one assignment pass labels the others."""
    others = torch.ones(len(x), dtype=torch.bool, device=x.device)
    others = torch.nonzero(others.index_fill_(0, run.positions, False)).flatten()
    labels = torch.empty(len(x), dtype=torch.long, device=x.device)
    labels.index_copy_(0, run.positions, run.labels)
    return labels.index_copy_(0, others, nearest(x.index_select(0, others), run.centers))


def take_rows(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The rows of ``x`` at the sorted ``positions`` (``x`` itself when that is all)."""
    return x if len(positions) == len(x) else x.index_select(0, positions.to(x.device))


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
    """Greedy k-means++, as scikit-learn seeds: pick centres one at a time; each step draws
    ``2 + ln(num_clusters)`` candidate rows with probability proportional to D(x)^2 (the
    squared distance to the nearest centre so far) and keeps the one that lowers the sum of
    D(x)^2 most, which spares the separated clusters plain k-means++ leaves without a
    centre. With fewer than ``_GREEDY_ROWS`` rows per cluster the candidates are most of
    the rows and one is drawn per step (plain k-means++): on the overlapping classes of
    ``benchmarks/kmeans.py`` (k=2000 from 4096 rows) the greedy choice cost 0.01 AMI.

    The random numbers come from the CPU ``generator`` and the distances from
    ``|x|^2 - 2 x.c + |c|^2``, so equal inputs and generator states give equal centres on
    every process; the loop never waits for the device. Once every row is a centre
    (duplicates), the last row is picked.
    """
    trials = 2 + int(math.log(num_clusters)) if len(x) >= _GREEDY_ROWS * num_clusters else 1
    first = torch.randint(len(x), (1,), generator=generator).to(x.device)
    draws = torch.rand((num_clusters, trials), generator=generator, dtype=torch.float64)
    draws = draws.to(x.device)
    x_sq = (x * x).sum(dim=1)
    chosen = [first]
    closest = _squared_distances(x, x_sq, first).squeeze(0)
    for i in range(1, num_clusters):
        cumulative = closest.cumsum(0, dtype=torch.float64)
        rows = torch.searchsorted(cumulative, cumulative[-1] * draws[i], right=True)
        rows = rows.clamp_(max=len(x) - 1)
        candidates = torch.minimum(_squared_distances(x, x_sq, rows), closest)
        best = candidates.sum(dim=1, dtype=torch.float64).argmin().unsqueeze(0)
        chosen.append(rows.index_select(0, best))
        closest = candidates.index_select(0, best).squeeze(0)
    return x.index_select(0, torch.cat(chosen))


def _squared_distances(x: torch.Tensor, x_sq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Squared distances of every row of ``x`` to its rows ``rows``, one row each."""
    bias = x_sq.index_select(0, rows).unsqueeze(1) + x_sq
    return torch.addmm(bias, x.index_select(0, rows), x.T, alpha=-2).clamp_(min=0)


def total_variance(x: torch.Tensor, origin: torch.Tensor, reducer: Reducer) -> float:
    """Sum over dimensions of the variance of every process's rows together.

    Moments are taken about ``origin`` (a point every process shares, near the data), so
    that the input's precision suffices for each block's sums, which are added in float64.
    """
    moments = torch.zeros(x.shape[1] + 2, dtype=torch.float64, device=x.device)
    moments[0] = len(x)
    rows = max(1, _SUM_BLOCK_ELEMENTS // max(1, x.shape[1]))
    for start in range(0, len(x), rows):
        shifted = x[start : start + rows] - origin
        moments[1:-1] += shifted.sum(dim=0)
        moments[-1] += torch.linalg.vector_norm(shifted).square()
    moments = reducer.sum(moments)
    count = float(moments[0])
    if count <= 1:
        return 0.0
    mean = moments[1:-1] / count
    return max(0.0, float(moments[-1] / count - (mean * mean).sum()))


def lloyd(
    x: torch.Tensor, centers: torch.Tensor, max_iter: int, threshold: float, reducer: Reducer
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's iterations with Hamerly's bounds, kept tight by measuring the centres that
    moved most.

    Each row keeps an upper bound on its distance to its centre and a lower bound on its
    distance to every other centre; a row whose upper bound stays below its lower bound
    keeps its centre without being measured. Hamerly loosens every lower bound by the
    largest move of any centre, and on overlapping clusters a few centres move far in
    every iteration, which would void every bound. So the centres that moved most are
    measured against every row (a GEMM with few columns), and the lower bounds loosen
    only by the largest move of the others. The rows left unproven are measured against
    every centre: a GEMM on those rows, or one pass over all rows when most need it.
    The clusters' sums are updated by the rows that changed cluster only.
    Stops when no row changes centre or the centres move less than ``threshold`` (sum of
    squared shifts). Returns the labels of the rows and the centres they are nearest to.
    """
    x_sq = (x * x).sum(dim=1)
    labels, upper, lower = nearest_two(x, centers, x_sq=x_sq)
    sums = cluster_sums(x, labels, len(centers))
    for _ in range(max_iter):
        new_centers = update_centers(x, sums, upper, centers, reducer)
        moved = (new_centers - centers).norm(dim=1)
        centers = new_centers
        rows, before = _reassign(x, x_sq, centers, moved, labels, upper, lower)
        _move_rows(sums, x, rows, before, labels.index_select(0, rows))
        changed = int(reducer.sum(torch.tensor([len(rows)], device=x.device)))
        if changed == 0 or float((moved * moved).sum()) <= threshold:
            break
    return labels, centers


def cluster_sums(x: torch.Tensor, labels: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """Each cluster's sum of rows and, in a last column, its count (float64).

    Each block of rows is summed per cluster in the input's precision (``index_add_`` is
    many times slower in float64 on CPU), and the blocks' sums are added in float64.
    """
    sums = torch.zeros((num_clusters, x.shape[1] + 1), dtype=torch.float64, device=x.device)
    rows = max(1, _SUM_BLOCK_ELEMENTS // max(1, x.shape[1]))
    block_sums = x.new_empty((num_clusters, x.shape[1]))
    for start in range(0, len(x), rows):
        block_sums.zero_().index_add_(0, labels[start : start + rows], x[start : start + rows])
        sums[:, :-1] += block_sums
    sums[:, -1] = torch.bincount(labels, minlength=num_clusters)
    return sums


def _move_rows(
    sums: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    before: torch.Tensor,
    after: torch.Tensor,
) -> None:
    """Move the rows ``rows`` of ``x`` from the clusters ``before`` to ``after`` in ``sums``."""
    if len(rows):
        moving = torch.cat([x.index_select(0, rows), x.new_ones((len(rows), 1))], dim=1)
        moving = moving.to(torch.float64)
        sums.index_add_(0, after, moving).index_add_(0, before, moving, alpha=-1)


def update_centers(
    x: torch.Tensor,
    sums: torch.Tensor,
    distance: torch.Tensor,
    centers: torch.Tensor,
    reducer: Reducer,
) -> torch.Tensor:
    """Means of the clusters (this process's ``sums`` added over every process); an empty
    cluster moves to the row farthest from its centre (by ``distance``)."""
    total = reducer.sum(sums)
    counts = total[:, -1]
    new_centers = (total[:, :-1] / counts.clamp(min=1).unsqueeze(1)).to(centers.dtype)
    empty = torch.nonzero(counts == 0).flatten()
    if len(empty):
        new_centers[empty] = reducer.farthest_rows(len(empty), distance, x).to(centers.dtype)
    return new_centers


def farthest_local(distance: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` largest distances, largest first, ties to the lower index."""
    return torch.argsort(distance, descending=True, stable=True)[:count]


def inertia(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of squared distances of the rows to their centres (float64, one element)."""
    rows = max(1, _SUM_BLOCK_ELEMENTS // max(1, x.shape[1]))
    total = torch.zeros(1, dtype=torch.float64, device=x.device)
    for start in range(0, len(x), rows):
        diff = x[start : start + rows] - centers.index_select(0, labels[start : start + rows])
        total += (diff * diff).sum(dtype=torch.float64)
    return total


def _reassign(
    x: torch.Tensor,
    x_sq: torch.Tensor,
    centers: torch.Tensor,
    moved: torch.Tensor,
    labels: torch.Tensor,
    upper: torch.Tensor,
    lower: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Update, in place, the labels and bounds of the rows after the centres moved by
    ``moved``; return the rows that changed centre and the centres they left."""
    upper += moved.index_select(0, labels)
    movers, others_moved = _movers(moved)
    weak = torch.nonzero(upper > lower - moved.max()).flatten()  # not proven by Hamerly's
    kept = lower.index_select(0, weak) - others_moved  # bound on the centres not movers
    if int((upper.index_select(0, weak) > kept).sum()) > _FULL_PASS * len(x):
        new_labels, upper[:], lower[:] = nearest_two(x, centers, labels, x_sq)
        changed = torch.nonzero(new_labels != labels).flatten()
        before = labels.index_select(0, changed)
        labels.copy_(new_labels)
        return changed, before
    lower -= moved.max()
    if len(movers) and len(weak):
        near = nearest_other(
            x.index_select(0, weak),
            x_sq.index_select(0, weak),
            centers,
            movers,
            labels.index_select(0, weak),
        )
        lower.index_copy_(0, weak, torch.minimum(kept, near))
    return _measure(x, x_sq, centers, labels, upper, lower)


def _measure(
    x: torch.Tensor,
    x_sq: torch.Tensor,
    centers: torch.Tensor,
    labels: torch.Tensor,
    upper: torch.Tensor,
    lower: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Measure the rows whose bounds allow another centre; as ``_reassign``."""
    check = _unproven(x, centers, labels, upper, lower)
    before = labels.index_select(0, check)
    new_labels, new_upper, new_lower = nearest_two(
        x.index_select(0, check), centers, before, x_sq.index_select(0, check)
    )
    upper.index_copy_(0, check, new_upper)
    lower.index_copy_(0, check, new_lower)
    changed = torch.nonzero(new_labels != before).flatten()
    rows = check.index_select(0, changed)
    labels.index_copy_(0, rows, new_labels.index_select(0, changed))
    return rows, before.index_select(0, changed)


def _movers(moved: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The centres that moved most and the largest move of the others (zero when there are
    none): about one centre in ``_MOVERS_PER``, rounded up to a power of two (at least 4;
    GEMMs with so few columns run well at those widths), but never a centre that did not
    move."""
    count = max(4, 1 << (len(moved) // _MOVERS_PER).bit_length())
    count = min(count, int((moved > 0).sum()))
    if count >= len(moved):
        return torch.arange(len(moved), device=moved.device), moved.new_zeros(())
    top = torch.topk(moved, count + 1)
    return top.indices[:count], top.values[count]


def _unproven(
    x: torch.Tensor,
    centers: torch.Tensor,
    labels: torch.Tensor,
    upper: torch.Tensor,
    lower: torch.Tensor,
) -> torch.Tensor:
    """Rows whose bounds allow another centre even after their upper bound is tightened
    to the distance to their centre (which it becomes, in place)."""
    check = torch.nonzero(upper > lower).flatten()
    own = centers.index_select(0, labels.index_select(0, check))
    tight = torch.linalg.vector_norm(x.index_select(0, check) - own, dim=1)
    upper.index_copy_(0, check, tight)
    return check[tight > lower.index_select(0, check)]
