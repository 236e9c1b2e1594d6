"""k-means clustering in PyTorch: the core's default ``kmeans_func`` (backend name ``torch``)."""

from __future__ import annotations

import torch

from .._validation import check_embeddings, check_positive_int, invalid
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["TorchKMeans"]

# Elements of one (rows, clusters) distance block.
_BLOCK_ELEMENTS = 1 << 23
# Keep Hamerly's bounds while at most this fraction of the rows needs measuring.
_KEEP_BOUNDS = 0.9


class TorchKMeans:
    """Lloyd's k-means with k-means++ seeding, on the input's device.

    Distances to the centres are computed in blocks of rows (one GEMM each), so memory
    stays linear in the number of rows. Seeding runs on a random subset of at most
    ``init_size`` rows, which keeps its one-centre-at-a-time loop cheap for large inputs.

    Args:
        n_init: Number of restarts from different seedings; the clustering with the
            smallest inertia (sum of squared distances to the centres) wins.
        max_iter: Most Lloyd iterations per restart.
        tol: Stop a restart when the centres move less than ``tol`` times the data's
            total variance (squared Euclidean), or when no assignment changes.
        seed: Seed of the random generator, for reproducible clusters; ``None`` draws a
            fresh one on every call.
        init_size: Most rows used for k-means++ seeding (``None``: all rows). At least
            ``num_clusters`` rows are always used.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.1, 5.0]])
        >>> labels = TorchKMeans(seed=0)(x, 2)
        >>> bool(labels[0] == labels[1]) and bool(labels[2] == labels[3])
        True
        >>> bool(labels[0] != labels[2])
        True
    """

    def __init__(
        self,
        n_init: int = 1,
        max_iter: int = 20,
        tol: float = 1e-4,
        seed: int | None = 0,
        init_size: int | None = 16384,
    ) -> None:
        self.n_init = check_positive_int(n_init, "n_init", "TorchKMeans")
        self.max_iter = check_positive_int(max_iter, "max_iter", "TorchKMeans")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise invalid("tol", "TorchKMeans", "a non-negative float", tol)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise invalid("seed", "TorchKMeans", "an int or None", seed, InvalidTypeError)
        if init_size is not None:
            init_size = check_positive_int(init_size, "init_size", "TorchKMeans")
        self.tol = float(tol)
        self.seed = seed
        self.init_size = init_size

    def __repr__(self) -> str:
        return (
            f"TorchKMeans(n_init={self.n_init}, max_iter={self.max_iter}, tol={self.tol}, "
            f"seed={self.seed}, init_size={self.init_size})"
        )

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, num_clusters: int) -> torch.Tensor:
        """Cluster the rows of ``x``; return one ``torch.long`` cluster id per row."""
        x = check_embeddings(x, "x", "TorchKMeans")
        num_clusters = check_positive_int(num_clusters, "num_clusters", "TorchKMeans")
        if num_clusters > len(x):
            raise InvalidArgumentError(
                f"The 'num_clusters' parameter of TorchKMeans must be at most the number of "
                f"rows ({len(x)}). Got {num_clusters} instead."
            )
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        generator = torch.Generator(device=x.device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        best_labels, best_inertia = self._run_once(x, num_clusters, generator)
        for _ in range(self.n_init - 1):
            labels, inertia = self._run_once(x, num_clusters, generator)
            if inertia < best_inertia:
                best_labels, best_inertia = labels, inertia
        return best_labels

    def _run_once(
        self, x: torch.Tensor, num_clusters: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, float]:
        centers = _kmeans_plus_plus(
            self._seeding_rows(x, num_clusters, generator), num_clusters, generator
        )
        threshold = self.tol * float(x.var(dim=0, unbiased=False).sum()) if len(x) > 1 else 0.0
        labels, centers = _lloyd(x, centers, self.max_iter, threshold)
        return labels, _inertia(x, centers, labels)

    def _seeding_rows(
        self, x: torch.Tensor, num_clusters: int, generator: torch.Generator
    ) -> torch.Tensor:
        size = len(x) if self.init_size is None else max(self.init_size, num_clusters)
        if size >= len(x):
            return x
        picked = torch.randperm(len(x), generator=generator, device=x.device)[:size]
        return x[picked]


def _kmeans_plus_plus(
    x: torch.Tensor, num_clusters: int, generator: torch.Generator
) -> torch.Tensor:
    """Pick centres one at a time, each with probability proportional to D(x)^2."""
    centers = torch.empty((num_clusters, x.shape[1]), dtype=x.dtype, device=x.device)
    x_sq = (x * x).sum(dim=1)
    first = int(torch.randint(len(x), (1,), generator=generator, device=x.device))
    centers[0] = x[first]
    closest = (x_sq - 2 * (x @ centers[0]) + x_sq[first]).clamp_(min=0)
    draws = torch.rand(num_clusters, generator=generator, device=x.device, dtype=torch.float64)
    for i in range(1, num_clusters):
        cumulative = closest.cumsum(0, dtype=torch.float64)
        total = float(cumulative[-1])
        if total > 0:  # draw a row with probability proportional to its D(x)^2
            target = draws[i] * total
            chosen = min(int(torch.searchsorted(cumulative, target, right=True)), len(x) - 1)
        else:  # every row is already a centre
            chosen = int(draws[i] * len(x))
        centers[i] = x[chosen]
        distance = (x_sq - 2 * (x @ centers[i]) + x_sq[chosen]).clamp_(min=0)
        torch.minimum(closest, distance, out=closest)
    return centers


def _lloyd(
    x: torch.Tensor, centers: torch.Tensor, max_iter: int, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's iterations with Hamerly's bounds, which skip rows whose centre cannot change.

    Each row keeps an upper bound on its distance to its centre and a lower bound on its
    distance to every other centre; after the centres move, only rows whose bounds no
    longer prove the assignment are measured again (a GEMM on those rows only). When the
    bounds stop pruning (overlapping clusters), plain passes, which are cheaper, take over.
    """
    labels, upper, lower = _nearest_two(x, centers)
    bounded = True
    for _ in range(max_iter):
        new_centers = _update_centers(x, labels, upper, centers)
        moved = (new_centers - centers).norm(dim=1)
        centers = new_centers
        if bounded:
            upper += moved[labels]
            lower -= _largest_other(moved, labels)
            changed, looked = _reassign(x, centers, labels, upper, lower)
            bounded = looked <= _KEEP_BOUNDS * len(x)
        else:
            new_labels, upper = _nearest(x, centers)
            changed = int((new_labels != labels).sum())
            labels = new_labels
        if changed == 0 or float((moved * moved).sum()) <= threshold:
            break
    return labels, centers


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
    half_gap = 0.5 * _nearest_two(centers, centers)[2]  # to the nearest other centre
    bound = torch.maximum(lower, half_gap[labels])
    check = torch.nonzero(upper > bound).flatten()
    if 2 * len(check) > len(x):  # most rows need a look: one pass without gathering them
        new_labels, upper[:], lower[:] = _nearest_two(x, centers)
        changed = int((new_labels != labels).sum())
        labels.copy_(new_labels)
        return changed, len(check)
    if len(check):
        upper[check] = (x[check] - centers[labels[check]]).norm(dim=1)
        check = check[upper[check] > bound[check]]
    if len(check) == 0:
        return 0, 0
    new_labels, upper[check], lower[check] = _nearest_two(x[check], centers)
    changed = int((new_labels != labels[check]).sum())
    labels[check] = new_labels
    return changed, len(check)


def _nearest(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def _nearest_two(
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
        values, indices = torch.topk(scores, min(2, len(centers)), dim=1, largest=False)
        values = values + block_sq
        error = slack * (block_sq + centers_sq.max())
        labels[start : start + rows] = indices[:, 0]
        upper[start : start + rows] = (values[:, 0] + error[:, 0]).clamp_(min=0).sqrt_()
        if len(centers) > 1:
            lower[start : start + rows] = (values[:, 1] - error[:, 0]).clamp_(min=0).sqrt_()
    return labels, upper, lower


def _inertia(x: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor) -> float:
    """Sum of squared distances of the rows to their centres, in row blocks."""
    rows = max(1, _BLOCK_ELEMENTS // x.shape[1])
    total = 0.0
    for start in range(0, len(x), rows):
        diff = x[start : start + rows] - centers[labels[start : start + rows]]
        total += float((diff * diff).sum(dtype=torch.float64))
    return total


def _update_centers(
    x: torch.Tensor, labels: torch.Tensor, distance: torch.Tensor, centers: torch.Tensor
) -> torch.Tensor:
    """Means of the clusters; an empty cluster moves to a row far from its centre."""
    num_clusters = len(centers)
    sums = torch.zeros_like(centers).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=num_clusters)
    new_centers = sums / counts.clamp(min=1).unsqueeze(1).to(x.dtype)
    empty = torch.nonzero(counts == 0).flatten()
    if len(empty):
        farthest = torch.topk(distance, len(empty)).indices
        new_centers[empty] = x[farthest]
    return new_centers
