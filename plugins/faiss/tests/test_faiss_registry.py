"""The plugin is found through its installed entry points, by the name ``faiss``."""

from __future__ import annotations

import pytest
import torch

import pytorch_metric_learning_faiss as plugin
from pytorch_metric_learning import evaluation
from pytorch_metric_learning.evaluation import (
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
)
from pytorch_metric_learning.evaluation.search.registry import backend_info

pytestmark = pytest.mark.faiss


def test_listed_as_installed_backends() -> None:
    assert "faiss" in list_knn_backends()
    assert "faiss" in list_kmeans_backends()


@pytest.mark.parametrize(
    ("kind", "target"), [("knn", plugin.FaissKNN), ("kmeans", plugin.FaissKMeans)]
)
def test_entry_points_belong_to_the_plugin_distribution(kind: str, target: type) -> None:
    (info,) = [row for row in backend_info(kind) if row.name == "faiss"]
    assert info.distributions == ("pytorch-metric-learning-faiss",)
    assert info.value == f"{target.__module__}:{target.__name__}"


def test_load_knn_func_by_name() -> None:
    knn = load_knn_func("faiss")
    assert type(knn) is plugin.FaissKNN
    assert knn.reset_before and knn.reset_after and knn.index_string is None


def test_load_knn_func_from_a_config_mapping() -> None:
    knn = load_knn_func({"name": "faiss", "index": "HNSW32"})
    assert type(knn) is plugin.FaissKNN and knn.index_string == "HNSW32"
    reference = torch.randn(100, 8, generator=torch.Generator().manual_seed(0))
    _, indices = knn(reference[:5], 1, reference)
    assert indices[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_load_knn_func_passes_options() -> None:
    knn = load_knn_func("faiss", reset_after=False, gpus=(0,), nprobe=8)
    assert (knn.reset_after, knn.gpus, knn.nprobe) == (False, (0,), 8)


def test_load_kmeans_func_by_name() -> None:
    kmeans = load_kmeans_func({"name": "faiss", "seed": 3, "niter": 5})
    assert type(kmeans) is plugin.FaissKMeans and kmeans.kwargs == {"seed": 3, "niter": 5}


def test_core_names_construct_the_plugin_classes() -> None:
    from pytorch_metric_learning.evaluation import FaissKMeans, FaissKNN

    knn = FaissKNN(reset_after=False, index="HNSW32")
    kmeans = FaissKMeans(seed=1)
    assert type(knn) is plugin.FaissKNN and knn.index_string == "HNSW32"
    assert type(kmeans) is plugin.FaissKMeans and kmeans.kwargs == {"seed": 1}
    assert isinstance(knn, evaluation.FaissKNN) and isinstance(kmeans, evaluation.FaissKMeans)
    assert not isinstance(kmeans, evaluation.FaissKNN)


def test_backends_follow_the_protocols() -> None:
    assert isinstance(plugin.FaissKNN(), evaluation.KNNFunc)
    assert isinstance(plugin.FaissKMeans(), evaluation.KMeansFunc)
