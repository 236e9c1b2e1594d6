"""k-means clustering in PyTorch: the core's default ``kmeans_func`` (backend name ``torch``).

The algorithm lives in ``_lloyd`` and is shared with ``DistributedKMeans``: this module is
its one-process driver.
"""

from __future__ import annotations

import torch

from ..._validation import check_embeddings, check_positive_int, invalid
from ...errors import InvalidArgumentError
from ._lloyd import LocalReducer, Options, check_seed, checked_options, kmeans

_SEED_MAX = 2**64 - 1

__all__ = ["TorchKMeans"]


class TorchKMeans:
    """Lloyd's k-means with greedy k-means++ seeding, on the input's device.

    Distances to the centres are computed in blocks of rows (one GEMM each), so memory
    stays linear in the number of rows. As faiss does, training uses a uniform sample of at
    most ``max_points_per_centroid`` rows per cluster (more rows barely move the centres);
    one assignment pass then labels the other rows. Seeding (greedy k-means++, as
    scikit-learn's, when there are at least 4 seeding rows per cluster) runs on a random
    subset of at most ``init_size`` of the training rows, which keeps its
    one-centre-at-a-time loop cheap. Lloyd's iterations skip the rows whose bounds prove
    their centre unchanged (Hamerly's bounds, kept tight by measuring the few centres that
    moved most), so later iterations cost a fraction of a pass. The random draws come from
    a CPU generator, so a seed gives the same clusters on any device, and the same as
    ``DistributedKMeans`` with that seed on one rank. Embeddings too large or too small
    for float32 squared distances (say 1e20 or 1e-25) are clustered after an exact
    power-of-two rescaling (one for every rank of a group), which changes no cluster.

    Args:
        n_init: Number of restarts from different seedings; the clustering with the
            smallest inertia (sum of squared distances to the centres) wins.
        max_iter: Most Lloyd iterations per restart.
        tol: Stop a restart when the centres move less than ``tol`` times the data's
            total variance (squared Euclidean), or when no assignment changes.
        seed: Seed of the random generator, for reproducible clusters; ``None`` draws a
            fresh one on every call.
        init_size: Most rows used for k-means++ seeding (``None``: all training rows). At
            least ``num_clusters`` rows are always used. The default was 16384 until the
            seeding's cost (one pass over these rows per centre) was measured at 0.4 s of
            2.6 s at k=1000 (``benchmarks/kmeans.py``); 2048 rows give NMI and AMI equal
            to or above faiss's on that benchmark's data. Greedy seeding needs 4 rows per
            cluster: for more than 512 separated clusters, raise it.
        max_points_per_centroid: Most training rows per cluster, as faiss's option of that
            name (default 256, faiss's default); ``None`` trains on every row.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.1, 5.0]])
        >>> labels = TorchKMeans(seed=0)(x, 2)
        >>> bool(labels[0] == labels[1]) and bool(labels[2] == labels[3])
        True
        >>> bool(labels[0] != labels[2])
        True
    """

    def __init__(
        self, n_init: int = 1, max_iter: int = 20, tol: float = 1e-4, seed: int | None = 0,
        init_size: int | None = 2048, max_points_per_centroid: int | None = 256,
    ) -> None:  # fmt: skip
        options = checked_options(
            "TorchKMeans", n_init, max_iter, tol, init_size, max_points_per_centroid
        )
        self.n_init, self.max_iter, self.tol = options.n_init, options.max_iter, options.tol
        self.init_size = options.init_size
        self.max_points_per_centroid = options.max_points_per_centroid
        self.seed = check_seed(seed, "TorchKMeans")
        if self.seed is not None and not 0 <= self.seed <= _SEED_MAX:
            # torch.Generator.manual_seed takes a uint64; NumPy's generators no negative seed
            raise invalid("seed", "TorchKMeans", "None or an int from 0 to 2**64 - 1", seed)

    def __repr__(self) -> str:
        return (
            f"TorchKMeans(n_init={self.n_init}, max_iter={self.max_iter}, tol={self.tol}, "
            f"seed={self.seed}, init_size={self.init_size}, "
            f"max_points_per_centroid={self.max_points_per_centroid})"
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
        generator = torch.Generator()
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return kmeans(x, len(x), num_clusters, self._options(), generator, LocalReducer())

    def _options(self) -> Options:
        return Options(
            self.n_init, self.max_iter, self.tol, self.init_size, self.max_points_per_centroid
        )
