"""The backend registry: hand-made entry points, and real plugin distributions from tests/plugins."""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest
import torch

from pytorch_metric_learning import errors
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance, SNRDistance
from pytorch_metric_learning.evaluation import (
    CustomKNN,
    KMeansFunc,
    KNNFunc,
    _install_hint,
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
    registry,
)


class FakeDist:
    def __init__(self, name: str) -> None:
        self.name = name
        self.metadata = {"Name": name}


def point(name: str, value: str, dist: str) -> EntryPoint:
    ep = EntryPoint(name=name, value=value, group=registry.KNN_GROUP)
    return ep._for(FakeDist(dist)) if hasattr(ep, "_for") else ep


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_test_plugins = pytest.mark.skipif(
    not installed("pml-toy-knn"), reason="the nox 'tests' session installs tests/plugins/*"
)


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._reset_for_tests()
    yield
    registry._reset_for_tests()


def test_core_backend_comes_from_an_entry_point() -> None:
    assert "custom" in list_knn_backends()
    info = {row.name: row for row in registry.backend_info("knn")}
    assert info["custom"].distributions == ("pytorch-metric-learning",)


def test_build_table_dedupes_and_groups() -> None:
    points = [
        point("a", "m:A", "plug-one"),
        point("a", "m:A", "plug-one"),
        point("b", "m:B", "plug-two"),
    ]
    table = registry.build_table(points)
    assert list(table) == ["a", "b"]
    assert len(table["a"]) == 1


def test_build_table_ignores_a_plugin_claiming_a_core_name() -> None:
    points = [
        point(
            "custom",
            "pytorch_metric_learning.evaluation.knn:default_custom_knn",
            "pytorch-metric-learning",
        ),
        point("custom", "thief:Backend", "thief-dist"),
    ]
    with pytest.warns(RuntimeWarning, match="thief-dist"):
        table = registry.build_table(points)
    assert [p.value for p in table["custom"]] == [
        "pytorch_metric_learning.evaluation.knn:default_custom_knn"
    ]


def test_listing_imports_no_backend_module(monkeypatch) -> None:
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [point("lazy", "module_that_does_not_exist:X", "d")]
    )
    assert list_knn_backends() == ["lazy"]
    assert "module_that_does_not_exist" not in sys.modules


def test_unknown_name_lists_installed_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown knn backend 'nope'.*'custom'") as info:
        load_knn_func("nope")
    assert isinstance(info.value, errors.PMLError)


def test_known_plugin_not_installed_gives_pip_command(monkeypatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    # An installation from the index (a checkout's hint: tests/evaluation/test_install_hint.py).
    monkeypatch.setattr(_install_hint, "source_checkout", lambda: None)
    with pytest.raises(
        ModuleNotFoundError, match=r'pip install "pytorch-metric-learning\[faiss\]"'
    ):
        load_knn_func("faiss")


def test_failing_import_names_distribution_and_chains_cause(monkeypatch) -> None:
    points = [
        point("bad", "module_that_does_not_exist:X", "bad-dist"),
        point(
            "custom",
            "pytorch_metric_learning.evaluation.knn:default_custom_knn",
            "pytorch-metric-learning",
        ),
    ]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    with pytest.raises(ImportError, match="bad-dist") as info:
        load_knn_func("bad")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert isinstance(load_knn_func("custom"), CustomKNN)


def test_two_distributions_for_one_name(monkeypatch) -> None:
    points = [point("twin", "a:X", "dist-a"), point("twin", "b:X", "dist-b")]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    assert list_knn_backends() == ["twin"]
    with pytest.raises(ValueError, match="dist-a, dist-b"):
        load_knn_func("twin")


def test_spec_forms() -> None:
    def my_knn(query, k, reference=None, ref_includes_query=False):
        return query[:, :k], torch.zeros(len(query), k, dtype=torch.long)

    assert load_knn_func(my_knn) is my_knn
    default = load_knn_func("custom")
    assert isinstance(default.distance, LpDistance) and default.distance.power == 2
    from_mapping = load_knn_func({"name": "custom", "distance": "cosine", "batch_size": 1024})
    assert isinstance(from_mapping.distance, CosineSimilarity) and from_mapping.batch_size == 1024
    assert isinstance(load_knn_func("custom", distance=SNRDistance()).distance, SNRDistance)


@pytest.mark.parametrize(
    ("name", "cls", "power", "normalize"),
    [
        ("euclidean", LpDistance, 1, False),
        ("squared_euclidean", LpDistance, 2, False),
        ("cosine", CosineSimilarity, 1, True),
        ("snr", SNRDistance, 1, False),
    ],
)
def test_distance_names(name, cls, power, normalize) -> None:
    distance = registry.distance_from_name(name)
    assert type(distance) is cls
    assert distance.power == power and distance.normalize_embeddings == normalize


@pytest.mark.parametrize(
    ("spec", "options", "error"),
    [
        (42, {}, TypeError),
        ({"batch_size": 3}, {}, ValueError),
        (lambda q, k, r=None, s=False: None, {"batch_size": 3}, TypeError),
        ({"name": "custom", "batch_size": 3}, {"batch_size": 4}, ValueError),
        ("custom", {"distance": "manhattan"}, ValueError),
    ],
)
def test_bad_specs(spec, options, error) -> None:
    with pytest.raises(error):
        load_knn_func(spec, **options)


def test_register_in_process() -> None:
    register_knn_backend("mine", lambda batch_size=8: CustomKNN(LpDistance(), batch_size))
    assert "mine" in list_knn_backends()
    assert load_knn_func("mine", batch_size=3).batch_size == 3
    with pytest.raises(ValueError, match="override=True"):
        register_knn_backend("mine", lambda: None)
    with pytest.raises(ValueError, match="override=True"):
        register_knn_backend("custom", lambda: None)
    register_knn_backend("custom", lambda: CustomKNN(CosineSimilarity()), override=True)
    assert isinstance(load_knn_func("custom").distance, CosineSimilarity)


def test_backends_are_checked_against_their_protocol() -> None:
    register_knn_backend("wrong_arity", lambda: lambda query: None)
    with pytest.raises(TypeError, match="KNNFunc"):
        load_knn_func("wrong_arity")
    register_knn_backend("not_callable", lambda: 3)
    with pytest.raises(TypeError):
        load_knn_func("not_callable")
    register_kmeans_backend("km", lambda: lambda x, num_clusters: torch.zeros(len(x)))
    assert "km" in list_kmeans_backends()
    assert isinstance(load_kmeans_func("km"), KMeansFunc)


def test_protocols_are_runtime_checkable() -> None:
    assert isinstance(CustomKNN(LpDistance()), KNNFunc)
    assert not isinstance(3, KNNFunc)


@needs_test_plugins
def test_third_party_plugin_selected_by_name() -> None:
    knn = load_knn_func("toy")
    x = torch.randn(10, 3)
    _, indices = knn(x, 2, x, True)
    _, expected = CustomKNN(LpDistance(normalize_embeddings=False))(x, 2, x, True)
    assert torch.equal(indices, expected)
    assert load_knn_func({"name": "toy", "largest": True}).largest is True


@needs_test_plugins
def test_installed_broken_plugin_breaks_only_its_name() -> None:
    with pytest.raises(ImportError, match="pml-broken-knn") as info:
        load_knn_func("broken")
    assert "broken on purpose" in str(info.value.__cause__)
    assert isinstance(load_knn_func("toy"), KNNFunc)


@needs_test_plugins
def test_installed_duplicate_and_core_name_thief() -> None:
    with pytest.warns(RuntimeWarning, match="pml-core-name-thief"):
        names = list_knn_backends()
    assert {"custom", "dup", "toy", "broken"} <= set(names)
    with pytest.raises(ValueError, match="pml-dup-one, pml-dup-two"):
        load_knn_func("dup")
    assert isinstance(load_knn_func("custom"), CustomKNN)


def test_importing_evaluation_imports_neither_faiss_nor_sklearn() -> None:
    code = (
        "import sys, pytorch_metric_learning.evaluation as e\n"
        "from pytorch_metric_learning.evaluation import CustomKNN, FaissKNN, FaissKMeans\n"
        "e.list_knn_backends()\n"
        "print(sorted(m for m in ('faiss', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_library_logging_is_silent_by_default() -> None:
    import logging

    logger = logging.getLogger("pytorch_metric_learning")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.level == logging.NOTSET
