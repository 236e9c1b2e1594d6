"""FaissKMeans: the KMeansFunc contract, options, reproducibility and bad input."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning_faiss import FaissKMeans

pytestmark = pytest.mark.faiss


def _blobs(
    seed: int, clusters: int, per_cluster: int, dims: int
) -> tuple[torch.Tensor, np.ndarray]:
    """Gaussian blobs around centers 100 apart (100 times the first unit vectors)."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.eye(clusters, dims) * 100
    truth = torch.arange(clusters).repeat_interleave(per_cluster)
    x = centers[truth] + torch.randn(len(truth), dims, generator=generator)
    return x, truth.numpy()


@pytest.mark.parametrize(("seed", "clusters", "dims"), [(0, 2, 2), (1, 3, 3), (2, 4, 6), (3, 5, 5)])
def test_recovers_well_separated_clusters(seed: int, clusters: int, dims: int) -> None:
    x, truth = _blobs(seed, clusters, 40, dims)
    labels = FaissKMeans(nredo=10, seed=seed)(x, clusters)
    assert adjusted_rand_score(truth, labels.numpy()) == pytest.approx(1.0)


def test_output_contract() -> None:
    x, _ = _blobs(0, 3, 20, 4)
    labels = FaissKMeans()(x.double().requires_grad_(), 3)
    assert labels.shape == (60,) and labels.dtype == torch.long
    assert labels.device == x.device and not labels.requires_grad
    assert set(labels.tolist()) == {0, 1, 2}


def test_labels_are_the_nearest_trained_centroid() -> None:
    # Independent check: recompute each row's nearest centroid with faiss's own k-means.
    x, _ = _blobs(1, 4, 30, 3)
    labels = FaissKMeans(seed=7, niter=10)(x, 4)
    reference = faiss.Kmeans(3, 4, seed=7, niter=10)
    reference.train(x.numpy())
    squared = ((x.double()[:, None, :] - torch.from_numpy(reference.centroids).double()) ** 2).sum(
        2
    )
    assert torch.equal(labels, squared.argmin(dim=1))


def test_same_seed_same_clusters() -> None:
    x = torch.randn(300, 5, generator=torch.Generator().manual_seed(0))  # no clear clusters
    first = FaissKMeans(seed=11)(x, 7)
    second = FaissKMeans(seed=11)(x, 7)
    assert torch.equal(first, second)


def test_kwargs_reach_faiss(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    original = faiss.Kmeans

    def spy(d: int, k: int, **kwargs: object) -> faiss.Kmeans:
        seen.update(d=d, k=k, **kwargs)
        return original(d, k, **kwargs)

    kmeans = FaissKMeans(niter=3, spherical=True, seed=5)
    monkeypatch.setattr(faiss, "Kmeans", spy)
    kmeans(torch.randn(50, 4), 2)
    # min_points_per_centroid=1 only silences faiss's own print (the plugin warns instead).
    expected = {"d": 4, "k": 2, "niter": 3, "spherical": True, "seed": 5}
    assert seen == {**expected, "min_points_per_centroid": 1}


@pytest.mark.parametrize(
    ("num_clusters", "error"),
    [
        (0, InvalidArgumentError),
        (-2, InvalidArgumentError),
        (11, InvalidArgumentError),
        (2.0, InvalidTypeError),
        (True, InvalidTypeError),
    ],
)
def test_num_clusters_is_validated(num_clusters: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="'num_clusters' parameter of FaissKMeans"):
        FaissKMeans()(torch.randn(10, 2), num_clusters)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("x", "error"),
    [
        (torch.zeros(5), InvalidArgumentError),
        (torch.zeros(5, 2, dtype=torch.int32), InvalidTypeError),
        (torch.full((5, 2), float("inf")), InvalidArgumentError),
    ],
)
def test_x_is_validated(x: torch.Tensor, error: type[Exception]) -> None:
    with pytest.raises(error, match="FaissKMeans"):
        FaissKMeans()(x, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"no_such_option": 1}, InvalidArgumentError, "Known options"),
        ({"k": 3}, InvalidArgumentError, "num_clusters"),
        ({"d": 3}, InvalidArgumentError, "num_clusters"),
        ({"niter": "many"}, InvalidTypeError, "wrong type"),
    ],
)
def test_bad_options_fail_at_construction(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        FaissKMeans(**kwargs)


def test_repr() -> None:
    assert repr(FaissKMeans(seed=3)) == "FaissKMeans(seed=3)"


@pytest.mark.parametrize("scale", [1e20, 1e-25, 2.0**-100])
def test_embeddings_at_the_edges_of_float32_are_clustered(scale: float) -> None:
    """faiss aborted the process on squared distances that overflow float32 (1e20) and
    tied those that underflow; the rows are rescaled by a power of two first."""
    x, truth = _blobs(seed=0, clusters=4, per_cluster=60, dims=8)
    labels = FaissKMeans(seed=1)(x * scale, 4)
    assert adjusted_rand_score(truth, labels.numpy()) == pytest.approx(1.0)
