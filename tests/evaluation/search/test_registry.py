"""The backend registry: hand-made entry points, and real plugin distributions from tests/plugins."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from importlib.metadata import EntryPoint

import pytest
import torch

from _subprocess import run_python
from pytorch_metric_learning import errors
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance, SNRDistance
from pytorch_metric_learning.evaluation import (
    CustomKNN,
    KMeansFunc,
    KNNFunc,
    list_kmeans_backends,
    list_knn_backends,
    load_kmeans_func,
    load_knn_func,
    register_kmeans_backend,
    register_knn_backend,
)
from pytorch_metric_learning.evaluation.search import _install_hint, registry


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
            "pytorch_metric_learning.evaluation.search.knn:default_custom_knn",
            "pytorch-metric-learning",
        ),
        point("custom", "thief:Backend", "thief-dist"),
    ]
    table = registry.build_table(points)
    assert [p.value for p in table["custom"]] == [
        "pytorch_metric_learning.evaluation.search.knn:default_custom_knn"
    ]
    assert [p.value for p in registry.core_name_claims(points)] == ["thief:Backend"]


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


def test_a_misspelled_name_suggests_the_installed_one() -> None:
    register_knn_backend("hnsw", lambda: CustomKNN(LpDistance()))
    with pytest.raises(errors.UnknownBackendError, match=r"'hnsx'.*Did you mean 'hnsw'\?"):
        load_knn_func({"name": "hnsx", "ef_search": 128})
    with pytest.raises(errors.UnknownBackendError) as info:
        load_knn_func("zzzz")
    assert "Did you mean" not in str(info.value)


def test_known_plugin_not_installed_gives_pip_command(monkeypatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    # An installation from the index (a checkout's hint: tests/evaluation/search/test_install_hint.py).
    monkeypatch.setattr(_install_hint, "source_checkout", lambda: None)
    with pytest.raises(
        ModuleNotFoundError, match=r"-m pip install -e CLONE/plugins/faiss .*not on the package"
    ):
        load_knn_func("faiss")


def test_failing_import_names_distribution_and_chains_cause(monkeypatch) -> None:
    points = [
        point("bad", "module_that_does_not_exist:X", "bad-dist"),
        point(
            "custom",
            "pytorch_metric_learning.evaluation.search.knn:default_custom_knn",
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
    out = run_python(code)
    assert out.stdout.strip() == "[]"


def test_library_logging_is_silent_by_default() -> None:
    import logging

    logger = logging.getLogger("pytorch_metric_learning")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.level == logging.NOTSET


# ----- what a plugin author sees when the entry point or factory is wrong -----

PLUGIN_MODULE = """
class Backend:
    def __init__(self, window=3, seed=0):
        self.window, self.seed = window, seed

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        raise AssertionError("never searched in these tests")


class WrongCall:
    def __call__(self, query):
        return None


backend = Backend()
"""


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A real module on sys.path, named uniquely so no test sees another's import."""
    name = f"pml_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def use_points(monkeypatch, *points) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: list(points))


def loading_error(monkeypatch, entry: tuple[str, str, str], expected: type) -> BaseException:
    """The error ``load_knn_func`` raises for the one entry point ``(name, target, dist)``."""
    use_points(monkeypatch, point(*entry))
    with pytest.raises(expected) as info:
        load_knn_func(entry[0])
    return info.value


def test_wrong_call_signature_shows_the_expected_one_and_the_distribution(
    monkeypatch, plugin_module
) -> None:
    error = loading_error(
        monkeypatch, ("wrong", f"{plugin_module}:WrongCall", "pml-wrong"), TypeError
    )
    message = str(error)
    assert isinstance(error, errors.BackendDefinitionError)
    assert "pml-wrong" in message and "'wrong'" in message
    assert "(query)" in message
    assert "(query, k, reference=None, ref_includes_query=False)" in message


def test_an_instance_named_by_the_entry_point_is_explained(monkeypatch, plugin_module) -> None:
    entry = ("inst", f"{plugin_module}:backend", "pml-inst")
    error = loading_error(monkeypatch, entry, errors.BackendDefinitionError)
    message = str(error)
    assert "pml-inst" in message
    assert "instance of Backend" in message and "not a factory" in message
    assert isinstance(error, TypeError)


def test_a_misspelled_module_names_it_and_does_not_say_reinstall(
    monkeypatch, plugin_module
) -> None:
    entry = ("typo", f"{plugin_module}_x:Backend", "pml-typo")
    error = loading_error(monkeypatch, entry, ImportError)
    message = str(error)
    assert f"{plugin_module}_x" in message and "pml-typo" in message
    assert "misspelled" in message and "Reinstall" not in message
    assert isinstance(error, errors.BackendImportError)


def test_a_misspelled_attribute_names_it_and_suggests_the_right_one(
    monkeypatch, plugin_module
) -> None:
    use_points(monkeypatch, point("typo", f"{plugin_module}:Backnd", "pml-typo"))
    with pytest.raises(ImportError, match="'Backnd'.*Did you mean 'Backend'") as info:
        load_knn_func("typo")
    assert "Reinstall" not in str(info.value) and "pml-typo" in str(info.value)


def test_a_missing_dependency_of_the_plugin_is_named_as_not_installed(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "pml_needs_missing_dep.py").write_text("import pml_dependency_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use_points(monkeypatch, point("dep", "pml_needs_missing_dep:X", "pml-dep"))
    with pytest.raises(errors.BackendImportError) as info:
        load_knn_func("dep")
    message = str(info.value)
    assert "'dep' of pml-dep" in message
    assert "module 'pml_dependency_not_there' it imports is not installed" in message
    assert "pml-dep's dependencies" in message
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    sys.modules.pop("pml_needs_missing_dep", None)


def test_a_plugin_module_that_raises_on_import_chains_the_cause(tmp_path, monkeypatch) -> None:
    (tmp_path / "pml_raises_on_import.py").write_text("raise RuntimeError('no GPU found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use_points(monkeypatch, point("boom", "pml_raises_on_import:X", "pml-boom"))
    with pytest.raises(ImportError, match="'boom' of pml-boom.*RuntimeError: no GPU found"):
        load_knn_func("boom")
    sys.modules.pop("pml_raises_on_import", None)


@pytest.mark.parametrize(
    "spec, unknown, hint",
    [
        ({"name": "custom", "k": 5}, "'k'", None),
        ({"name": "custom", "batch_sise": 64}, "'batch_sise'", "Did you mean 'batch_size'"),
    ],
)
def test_an_unknown_spec_option_lists_the_accepted_ones(spec, unknown, hint) -> None:
    with pytest.raises(errors.InvalidBackendOptionError) as info:
        load_knn_func(spec)
    message = str(info.value)
    assert unknown in message and "'custom'" in message
    assert "['distance', 'batch_size']" in message
    assert "default_custom_knn()" not in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    if hint:
        assert hint in message


def test_an_unknown_option_of_a_plugin_names_its_distribution(monkeypatch, plugin_module) -> None:
    use_points(monkeypatch, point("win", f"{plugin_module}:Backend", "pml-win"))
    with pytest.raises(ValueError, match=r"\['windw'\].*pml-win.*\['window', 'seed'\]"):
        load_knn_func({"name": "win", "windw": 4})
    assert load_knn_func({"name": "win", "window": 4}).window == 4


def test_accuracy_calculator_reports_an_unknown_option_the_same_way() -> None:
    from pytorch_metric_learning.evaluation import AccuracyCalculator

    with pytest.raises(ValueError, match="Unknown option.*'k'.*'batch_size'"):
        AccuracyCalculator(knn_func={"name": "custom", "k": 5})


# ----- "a plugin claims a core name": once per environment, then only logged -----


class VersionedDist(FakeDist):
    def __init__(self, name: str, version: str) -> None:
        super().__init__(name)
        self.version = version


def claim_points(version: str) -> list[EntryPoint]:
    core = EntryPoint(
        name="custom",
        value="pytorch_metric_learning.evaluation.search.knn:default_custom_knn",
        group=registry.KNN_GROUP,
    )
    thief = EntryPoint(name="custom", value="thief:Backend", group=registry.KNN_GROUP)
    if not hasattr(core, "_for"):
        pytest.skip("EntryPoint cannot carry a distribution on this Python")
    return [
        core._for(VersionedDist("pytorch-metric-learning", "3.0")),
        thief._for(VersionedDist("thief-dist", version)),
    ]


def claim_warnings(monkeypatch, version: str) -> list[str]:
    import warnings

    registry._reset_for_tests()  # a new run: the registry reads the entry points again
    monkeypatch.setattr(registry, "entry_points", lambda group: claim_points(version))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list_knn_backends()
    return [str(w.message) for w in caught if "thief-dist" in str(w.message)]


def test_core_name_claim_warns_once_per_environment_change(monkeypatch, caplog) -> None:
    assert len(claim_warnings(monkeypatch, "1.0")) == 1
    with caplog.at_level("INFO", logger=registry.__name__):
        assert claim_warnings(monkeypatch, "1.0") == []
    assert "thief-dist" in caplog.text  # still said, in the log
    assert len(claim_warnings(monkeypatch, "1.1")) == 1  # the plugin changed
    assert claim_warnings(monkeypatch, "1.1") == []
    assert isinstance(load_knn_func("custom"), CustomKNN)


@pytest.mark.parametrize("breakage", ["file_as_folder", "corrupt"])
def test_an_unusable_cache_never_fails_and_keeps_warning(monkeypatch, tmp_path, breakage):
    cache = tmp_path / "cache"
    if breakage == "file_as_folder":
        cache.write_text("not a folder")
    else:
        cache.mkdir()
        (cache / "seen_notices.json").write_text("{not json")
    monkeypatch.setenv("PML_CACHE_DIR", str(cache))
    assert len(claim_warnings(monkeypatch, "1.0")) == 1
    expected_again = 1 if breakage == "file_as_folder" else 0
    assert len(claim_warnings(monkeypatch, "1.0")) == expected_again
    if cache.is_dir():
        assert [p.name for p in cache.iterdir()] == ["seen_notices.json"]  # no temp files


@pytest.mark.slow
@needs_test_plugins
def test_core_name_claim_warns_in_the_first_run_only(tmp_path) -> None:
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "from pytorch_metric_learning.evaluation import list_knn_backends\n"
        "list_knn_backends()\n"
    )
    env = {**os.environ, "PML_CACHE_DIR": str(tmp_path / "cache")}
    runs = [run_python(code, env=env) for _ in range(2)]
    assert "pml-core-name-thief" in runs[0].stderr
    assert "pml-core-name-thief" not in runs[1].stderr


def test_a_missing_required_option_is_named() -> None:
    register_knn_backend("needs_distance", CustomKNN)
    with pytest.raises(ValueError, match=r"'needs_distance' needs the options \['distance'\]"):
        load_knn_func("needs_distance")
    assert isinstance(load_knn_func({"name": "needs_distance", "distance": "cosine"}), CustomKNN)


def test_an_entry_point_naming_a_module_or_a_value_is_explained(monkeypatch, plugin_module) -> None:
    use_points(monkeypatch, point("mod", plugin_module, "pml-mod"))
    with pytest.raises(errors.BackendDefinitionError, match="pml-mod.*not callable.*factory"):
        load_knn_func("mod")


@needs_test_plugins
def test_a_plugins_wrong_answer_names_its_distribution() -> None:
    from pytorch_metric_learning.evaluation import AccuracyCalculator

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (30,), generator=generator)
    embeddings = torch.randn(30, 4, generator=generator)
    farthest_first = {"name": "toy", "largest": True}  # distances, largest first
    calculator = AccuracyCalculator(include=("r_precision",), knn_func=farthest_first)
    with pytest.raises(errors.BackendOutputError) as info:
        calculator.get_accuracy(embeddings, labels)
    message = str(info.value)
    assert "'toy' (ToyKNN)" in message and "not sorted nearest first" in message
    assert message.endswith("Backend 'toy' comes from the distribution pml-toy-knn.")


class FailsToBuild:
    def __init__(self, error: Exception, size: int = 1) -> None:
        raise error


@pytest.mark.parametrize(
    "error, expected, builtin",
    [
        (RuntimeError("no licence found"), errors.BackendRuntimeError, RuntimeError),
        (ValueError("size too large"), errors.InvalidBackendOptionError, ValueError),
        (TypeError("size must be int"), errors.InvalidBackendOptionError, TypeError),
    ],
)
def test_a_factorys_own_error_names_the_backend(error, expected, builtin) -> None:
    register_knn_backend("fragile", lambda size=1: FailsToBuild(error, size))
    with pytest.raises(expected) as info:
        load_knn_func({"name": "fragile", "size": 3})
    message = str(info.value)
    assert "'fragile'" in message and "{'size': 3}" in message and str(error) in message
    assert isinstance(info.value, builtin) and info.value.__cause__ is error


@pytest.mark.parametrize(
    "error", [errors.InvalidArgumentError("bad 'space'"), ModuleNotFoundError("no hnswlib")]
)
def test_a_factorys_library_error_and_missing_module_pass_unchanged(error) -> None:
    register_knn_backend("fragile", lambda: FailsToBuild(error))
    with pytest.raises(type(error)) as info:
        load_knn_func("fragile")
    assert info.value is error
