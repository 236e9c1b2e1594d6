"""k-means clustering in PyTorch: the core's default ``kmeans_func`` (backend name ``torch``)."""

from __future__ import annotations

import torch

from .._validation import check_embeddings, check_positive_int, invalid
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["TorchKMeans"]

# Elements of one (rows, clusters) distance block.
_BLOCK_ELEMENTS = 1 << 23


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
        labels, min_dist = _assign(x, centers)
        for _ in range(self.max_iter):
            new_centers = _update_centers(x, labels, min_dist, centers)
            shift = float(((new_centers - centers) ** 2).sum())
            centers = new_centers
            new_labels, min_dist = _assign(x, centers)
            converged = shift <= threshold or torch.equal(new_labels, labels)
            labels = new_labels
            if converged:
                break
        return labels, float(min_dist.sum())

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
    for i in range(1, num_clusters):
        weights = closest if float(closest.sum()) > 0 else torch.ones_like(closest)
        chosen = int(torch.multinomial(weights, 1, generator=generator))
        centers[i] = x[chosen]
        distance = (x_sq - 2 * (x @ centers[i]) + x_sq[chosen]).clamp_(min=0)
        torch.minimum(closest, distance, out=closest)
    return centers


def _assign(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centre of every row and the squared distance to it, in row blocks."""
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


def _update_centers(
    x: torch.Tensor, labels: torch.Tensor, min_dist: torch.Tensor, centers: torch.Tensor
) -> torch.Tensor:
    """Means of the clusters; an empty cluster moves to a row far from its centre."""
    num_clusters = len(centers)
    sums = torch.zeros_like(centers).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=num_clusters)
    new_centers = sums / counts.clamp(min=1).unsqueeze(1).to(x.dtype)
    empty = torch.nonzero(counts == 0).flatten()
    if len(empty):
        farthest = torch.topk(min_dist, len(empty)).indices
        new_centers[empty] = x[farthest]
    return new_centers
