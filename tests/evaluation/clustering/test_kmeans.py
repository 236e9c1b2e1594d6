"""The PyTorch k-means backend."""

from __future__ import annotations

import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import KMeansFunc, TorchKMeans, load_kmeans_func
from pytorch_metric_learning.evaluation.clustering import _lloyd as _lloyd_module
from pytorch_metric_learning.evaluation.clustering._lloyd import LocalReducer, lloyd
from pytorch_metric_learning.evaluation.clustering._lloyd_assign import nearest_other, nearest_two
from pytorch_metric_learning.evaluation.distributed import DistributedKMeans


def blobs(num_clusters, per_cluster, dims=16, spread=0.05, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centers = 10 * torch.randn(num_clusters, dims, generator=generator)
    labels = torch.arange(num_clusters).repeat_interleave(per_cluster)
    return centers[labels] + spread * torch.randn(len(labels), dims, generator=generator), labels


def inertia(x, labels):
    total = 0.0
    for cluster in labels.unique():
        members = x[labels == cluster].double()
        total += float(((members - members.mean(0)) ** 2).sum())
    return total


@pytest.mark.parametrize("num_clusters", [2, 10, 60])
def test_recovers_separated_clusters(num_clusters):
    x, labels = blobs(num_clusters, 20)
    clusters = TorchKMeans(n_init=3)(x, num_clusters)
    assert clusters.dtype == torch.long and clusters.shape == labels.shape
    assert normalized_mutual_info_score(labels.numpy(), clusters.numpy()) == pytest.approx(1.0)


def test_nearest_centre_and_bounds():
    x, _ = blobs(5, 10, spread=2.0)
    centers = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(1))[:7]]
    labels, upper, lower = nearest_two(x, centers)
    brute = torch.cdist(x.double(), centers.double())
    two = brute.topk(2, dim=1, largest=False).values
    assert torch.equal(labels, brute.argmin(dim=1))
    assert bool((upper.double() >= two[:, 0] - 1e-9).all())
    assert bool((lower.double() <= two[:, 1] + 1e-9).all())
    assert bool((upper.double() - two[:, 0] < 0.5).all())  # widened by rounding only


def plain_lloyd(x, centers, iterations):
    x, centers = x.double(), centers.double().clone()
    labels = torch.cdist(x, centers).argmin(dim=1)
    for _ in range(iterations):
        for c in range(len(centers)):
            members = x[labels == c]
            if len(members):
                centers[c] = members.mean(dim=0)
        new_labels = torch.cdist(x, centers).argmin(dim=1)
        if torch.equal(new_labels, labels):
            break
        labels = new_labels
    return labels


@pytest.mark.parametrize(
    ("seed", "spread", "num_clusters", "per_cluster"),
    [(5, 1.0, 30, 20), (4, 2.0, 30, 20), (0, 7.0, 15, 12), (3, 40.0, 15, 12), (4, 40.0, 15, 12)],
)
def test_bounded_lloyd_equals_plain_lloyd(seed, spread, num_clusters, per_cluster):
    """Hamerly's bounds only skip work (they spare rows a measurement for the separated
    clusters of the first two cases), and plain passes take over when clusters overlap:
    either way the iterations end where plain Lloyd's do. (No cluster empties in these
    cases; the oracle does not move empty clusters.)"""
    x, _ = blobs(num_clusters, per_cluster, spread=spread, seed=seed)
    x = x.double()  # float64 on both sides: no assignment decided by rounding
    rows = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    start = x[rows[:num_clusters]]
    labels, _ = lloyd(x, start.clone(), 100, 0.0, LocalReducer())
    assert torch.equal(labels, plain_lloyd(x, start, 100))


def test_a_fixed_seed_is_reproducible():
    x, _ = blobs(8, 15, spread=3.0)
    assert torch.equal(TorchKMeans(seed=5)(x, 8), TorchKMeans(seed=5)(x, 8))


def test_restarts_never_increase_inertia():
    x, _ = blobs(12, 10, spread=6.0, seed=2)
    one = TorchKMeans(seed=3, n_init=1)(x, 12)
    several = TorchKMeans(seed=3, n_init=4)(x, 12)  # its first restart is the same run
    assert inertia(x, several) <= inertia(x, one) + 1e-6


def test_every_point_its_own_cluster_and_duplicates():
    x, _ = blobs(1, 6, spread=1.0)
    assert sorted(TorchKMeans()(x, 6).tolist()) == list(range(6))
    same = torch.ones(10, 3)
    clusters = TorchKMeans()(same, 3)
    assert clusters.shape == (10,) and int(clusters.min()) >= 0 and int(clusters.max()) < 3


def test_seeding_on_a_subset_still_finds_the_clusters():
    x, labels = blobs(20, 30)
    clusters = TorchKMeans(init_size=100, n_init=2)(x, 20)
    assert normalized_mutual_info_score(labels.numpy(), clusters.numpy()) > 0.95


def test_half_precision_input():
    x, labels = blobs(3, 10)
    clusters = TorchKMeans()(x.half(), 3)
    assert normalized_mutual_info_score(labels.numpy(), clusters.numpy()) == pytest.approx(1.0)


# DistributedKMeans is the same algorithm with another driver: it takes the same options.
@pytest.mark.parametrize("kmeans_class", [TorchKMeans, DistributedKMeans])
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n_init": 0}, InvalidArgumentError),
        ({"max_iter": 1.5}, InvalidTypeError),
        ({"tol": -1.0}, InvalidArgumentError),
        ({"seed": "a"}, InvalidTypeError),
        ({"init_size": 0}, InvalidArgumentError),
        ({"max_points_per_centroid": 0}, InvalidArgumentError),
        ({"max_points_per_centroid": 1.5}, InvalidTypeError),
    ],
)
def test_invalid_options(kmeans_class, kwargs, error):
    (name,) = kwargs
    with pytest.raises(error, match=f"'{name}' parameter of {kmeans_class.__name__}"):
        kmeans_class(**kwargs)


def test_invalid_calls():
    x, _ = blobs(2, 3)
    with pytest.raises(ValueError, match="num_clusters"):
        TorchKMeans()(x, 7)
    with pytest.raises(ValueError):
        TorchKMeans()(x, 0)
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        TorchKMeans()(x, 2)


def test_registered_as_the_torch_backend():
    backend = load_kmeans_func({"name": "torch", "seed": 1, "n_init": 2})
    assert isinstance(backend, TorchKMeans) and isinstance(backend, KMeansFunc)
    assert (backend.seed, backend.n_init) == (1, 2)


def test_docstring_examples():
    import doctest

    from pytorch_metric_learning.evaluation.clustering import kmeans as module

    assert doctest.testmod(module, raise_on_error=False).failed == 0


def gaussian_classes(num_classes, per_class, dims=32, noise=1.0, seed=0):
    """Overlapping classes, as real embeddings: a unit-normal centre per class plus noise."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, dims, generator=generator)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return centers[labels] + noise * torch.randn(len(labels), dims, generator=generator), labels


def test_a_seed_fixes_the_clusters_and_another_seed_changes_them():
    x, _ = gaussian_classes(12, 60, noise=1.2)
    first = TorchKMeans(seed=7, max_points_per_centroid=20)(x, 12)
    assert torch.equal(first, TorchKMeans(seed=7, max_points_per_centroid=20)(x, 12))
    assert not torch.equal(first, TorchKMeans(seed=8, max_points_per_centroid=20)(x, 12))


@pytest.mark.parametrize(("per_centroid", "trained"), [(20, 160), (256, 400), (None, 400)])
def test_training_sample_and_final_assignment(monkeypatch, per_centroid, trained):
    """At most max_points_per_centroid * k rows train; then every row gets its nearest of
    the trained centres (checked against a float64 brute-force argmin)."""
    x, _ = gaussian_classes(8, 50, dims=6, noise=1.5)
    x = x.double()
    runs = []
    real_lloyd = _lloyd_module.lloyd

    def recording_lloyd(rows, *args):
        labels, centers = real_lloyd(rows, *args)
        runs.append((len(rows), centers))
        return labels, centers

    monkeypatch.setattr(_lloyd_module, "lloyd", recording_lloyd, raising=True)
    clusters = TorchKMeans(seed=2, max_points_per_centroid=per_centroid)(x, 8)
    monkeypatch.undo()
    assert [size for size, _ in runs] == [trained]
    assert torch.equal(clusters, torch.cdist(x, runs[0][1]).argmin(dim=1))


def test_training_on_a_sample_clusters_about_as_well_as_on_every_row():
    """2,000 overlapping points in 10 classes; 40 rows per centroid train (400 rows).

    The sample's centres are each the mean of ~40 rows instead of ~200, off by about
    noise / sqrt(40) = 0.16 per coordinate against class centres ~1.4 apart, so only rows
    near a boundary can change cluster: NMI and AMI against the classes stay within 0.03
    of full-data k-means (measured: within 0.01), and the two clusterings agree (NMI > 0.85).
    """
    x, labels = gaussian_classes(10, 200, dims=32, noise=1.0, seed=4)
    sampled = TorchKMeans(seed=0, n_init=2, max_points_per_centroid=40)(x, 10).numpy()
    full = TorchKMeans(seed=0, n_init=2, max_points_per_centroid=None)(x, 10).numpy()
    for score in (normalized_mutual_info_score, adjusted_mutual_info_score):
        assert score(labels.numpy(), sampled) == pytest.approx(
            score(labels.numpy(), full), abs=0.03
        )
    assert normalized_mutual_info_score(full, sampled) > 0.85


def test_clusters_separated_blobs_as_well_as_scikit_learn():
    """40 well-separated blobs: greedy k-means++ seeding (on the default sample) and the bounded
    Lloyd iterations reach scikit-learn's quality (its k-means++ and Lloyd, one run)."""
    x, labels = blobs(40, 30, dims=16, spread=1.0, seed=6)
    ours = TorchKMeans(seed=0)(x, 40).numpy()
    theirs = KMeans(n_clusters=40, n_init=1, random_state=0).fit_predict(x.numpy())
    truth = labels.numpy()
    assert normalized_mutual_info_score(truth, ours) >= (
        normalized_mutual_info_score(truth, theirs) - 0.01
    )
    assert inertia(x, torch.from_numpy(ours)) <= 1.05 * inertia(x, torch.from_numpy(theirs))


def test_a_seed_gives_the_same_clusters_on_a_large_sampled_run():
    """Sampling, seeding and the bounded iterations are deterministic for a seed, also
    when the training sample, the movers and the partial passes are all in play."""
    x, _ = gaussian_classes(64, 40, dims=24, noise=1.3, seed=9)
    kmeans = TorchKMeans(seed=11, max_points_per_centroid=30, init_size=512)
    first = kmeans(x, 64)
    assert torch.equal(first, kmeans(x, 64))
    assert torch.equal(
        first, TorchKMeans(seed=11, max_points_per_centroid=30, init_size=512)(x, 64)
    )


def test_total_variance_about_a_shared_origin():
    """Far from the origin, the float32 moments about a nearby point still give numpy's
    float64 variance."""
    x, _ = gaussian_classes(5, 40, dims=8, noise=2.0, seed=1)
    x = x + 1000.0
    expected = float(x.double().numpy().var(axis=0).sum())
    assert _lloyd_module.total_variance(x, x[3], LocalReducer()) == pytest.approx(
        expected, rel=1e-4
    )


def test_nearest_other_is_a_tight_lower_bound():
    """The distance to the nearest of some centres other than the row's own, against a
    float64 brute force."""
    x, _ = blobs(6, 12, spread=3.0, seed=2)
    centers = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(3))[:9]]
    labels = torch.cdist(x, centers).argmin(dim=1)
    among = torch.tensor([1, 4, 7])
    bound = nearest_other(x, (x * x).sum(dim=1), centers, among, labels)
    brute = torch.cdist(x.double(), centers[among].double())
    brute[labels.unsqueeze(1) == among] = float("inf")
    nearest = brute.min(dim=1).values
    assert bool((bound.double() <= nearest + 1e-9).all())
    finite = torch.isfinite(nearest)
    assert bool((nearest[finite] - bound[finite].double() < 0.5).all())


@pytest.mark.parametrize("exponent", [80, -90, 126])
def test_embeddings_scaled_by_a_power_of_two_get_the_same_clusters(exponent):
    # Squared distances of 2**80 or 2**-90 embeddings overflow or underflow float32: the
    # rows are scaled back by a power of two, which is exact, so nothing else changes.
    x, _ = blobs(6, 40, spread=3.0)
    x = x / x.abs().max()  # magnitude 1: the unscaled run is not rescaled itself
    expected = TorchKMeans(seed=3, n_init=2)(x, 6)
    assert torch.equal(TorchKMeans(seed=3, n_init=2)(x * 2.0**exponent, 6), expected)


@pytest.mark.parametrize("scale", [1e20, 1e-25])
def test_embeddings_at_the_edges_of_float32_are_clustered_like_unscaled_ones(scale):
    x, labels = blobs(8, 30, spread=1.0)
    clusters = TorchKMeans(seed=0)(x * scale, 8)
    assert normalized_mutual_info_score(labels.numpy(), clusters.numpy()) == pytest.approx(1.0)
