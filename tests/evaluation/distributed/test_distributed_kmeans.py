"""DistributedKMeans on spawned gloo groups and on a one-rank group."""

from __future__ import annotations

import pytest
import torch
from _dist_plans import DIMS, KMEANS_COUNTS, blobs
from _dist_workers import assert_raised_on
from sklearn.cluster import KMeans

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import TorchKMeans, list_kmeans_backends, load_kmeans_func
from pytorch_metric_learning.evaluation.distributed import DistributedKMeans


def same_partition(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two labelings group the rows identically (cluster ids may differ)."""
    pairs = {(int(a), int(b)) for a, b in zip(first, second)}
    return len(pairs) == len(set(first.tolist())) == len(set(second.tolist()))


def _gathered(results, world: int, name: str) -> torch.Tensor:
    for rank in range(world):
        assert "value" in results[rank][name], results[rank][name].get("traceback")
    return torch.cat([results[rank][name]["value"] for rank in range(world)])


@pytest.mark.slow
def test_blobs_are_recovered_as_scikit_learn_does(ran) -> None:
    world, cases, results = ran
    case = cases["kmeans_blobs"]
    labels = _gathered(results, world, "kmeans_blobs")
    assert labels.dtype == torch.long and len(labels) == sum(case["counts"])
    oracle = KMeans(n_clusters=5, n_init=10, random_state=0).fit_predict(case["x"].numpy())
    assert same_partition(labels, torch.from_numpy(oracle))
    assert same_partition(labels, blobs(case["counts"], 5, seed=11)[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kmeans_overlapping", "kmeans_sampled", "kmeans_scaled"])
def test_sharding_does_not_change_the_clustering(ran, one_rank_group, name: str) -> None:
    """Also when training on a sample (20 of 73 rows): the sample is drawn from global row
    numbers, so the ranks train on the rows one process would; and when rows too large for
    float32 distances are rescaled: by one power of two, the largest over every rank."""
    world, cases, results = ran
    case = cases[name]
    alone = DistributedKMeans(**case["options"])(case["x"], case["num_clusters"])
    assert len(set(alone.tolist())) == case["num_clusters"]
    assert torch.equal(_gathered(results, world, name), alone)
    assert torch.equal(TorchKMeans(**case["options"])(case["x"], case["num_clusters"]), alone)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "fragment"),
    [("kmeans_mismatch", "must be the same on every rank"), ("kmeans_too_many", "at most")],
)
def test_invalid_arguments_raise_on_every_rank(ran, name: str, fragment: str) -> None:
    world, _, results = ran
    assert_raised_on(range(world), results, name, "InvalidArgumentError", fragment)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"seed": 3, "n_init": 3, "tol": 0.0},
        {"max_points_per_centroid": 4, "init_size": 5},
        {"max_points_per_centroid": None, "init_size": None, "max_iter": 2},
    ],
)
def test_one_rank_equals_torch_kmeans(one_rank_group, options) -> None:
    """One algorithm, two drivers: on one rank the all-reduce driver is the local one."""
    x = torch.randn(90, DIMS, generator=torch.Generator().manual_seed(8))
    expected = TorchKMeans(**options)(x, 6)
    assert torch.equal(DistributedKMeans(**options)(x, 6), expected)


def test_registered_as_a_kmeans_backend() -> None:
    assert "torch_distributed" in list_kmeans_backends()
    kmeans = load_kmeans_func({"name": "torch_distributed", "max_iter": 7})
    assert isinstance(kmeans, DistributedKMeans) and kmeans.max_iter == 7


def test_a_negative_timeout_is_refused() -> None:
    # the options shared with TorchKMeans: test_invalid_options in clustering/test_kmeans.py
    with pytest.raises(InvalidArgumentError, match="'timeout' parameter of DistributedKMeans"):
        DistributedKMeans(timeout=-3)


def test_one_rank_matches_scikit_learn_on_blobs(one_rank_group) -> None:
    x, blob = blobs([120], 6, seed=3)
    labels = DistributedKMeans(seed=None, n_init=3)(x.double(), 6)
    assert labels.dtype == torch.long
    assert same_partition(labels, blob)


def test_half_precision_input_is_clustered(one_rank_group) -> None:
    x, blob = blobs([40], 3, seed=4)
    assert same_partition(DistributedKMeans()(x.half(), 3), blob)


def test_duplicate_rows_leave_no_crash_and_valid_ids(one_rank_group) -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]).repeat(4, 1)
    labels = DistributedKMeans(max_iter=5)(x, 4)
    assert labels.shape == (12,) and int(labels.min()) >= 0 and int(labels.max()) < 4
    assert same_partition(labels[:3].repeat(4), labels)


def test_an_empty_cluster_moves_to_the_farthest_row(one_rank_group) -> None:
    # Seeding from two rows only puts both centres on the far-left pair.
    x = torch.tensor([[0.0], [0.1], [10.0], [10.2], [10.4]])
    labels = DistributedKMeans(init_size=2, seed=1)(x, 2)
    assert same_partition(labels, torch.tensor([0, 0, 1, 1, 1]))


def test_one_rank_rejects_bad_inputs(one_rank_group) -> None:
    with pytest.raises(InvalidArgumentError, match="at most the number of rows"):
        DistributedKMeans()(torch.zeros(2, DIMS), 3)
    with pytest.raises(InvalidTypeError, match="'x' parameter of DistributedKMeans"):
        DistributedKMeans()(torch.zeros(2, DIMS, dtype=torch.long), 1)


def test_kmeans_counts_cover_an_empty_shard() -> None:
    assert 0 in KMEANS_COUNTS[3]
