"""Without faiss, ``utils.inference`` still imports and searches, and its faiss names say
what to install when used."""

from __future__ import annotations

import importlib.util
import re
import textwrap

import pytest
import torch

from _subprocess import run_python
from pytorch_metric_learning.errors import BackendNotInstalledError
from pytorch_metric_learning.evaluation.search import registry
from pytorch_metric_learning.evaluation.search._install_hint import plugin_install_hint
from pytorch_metric_learning.utils import inference

# The hint itself (a checkout's path or the published extra) is checked against this
# installation's direct_url.json in tests/evaluation/search/test_install_hint.py; here each
# faiss name must route to it.
EXTRA = re.escape(plugin_install_hint("faiss"))
PLUGIN_INSTALLED = importlib.util.find_spec("pytorch_metric_learning_faiss") is not None

CALLS = {
    "add_to_index_and_search": lambda: inference.add_to_index_and_search(
        None, torch.zeros(1, 2), None, 1
    ),
    "convert_to_gpu_index": lambda: inference.convert_to_gpu_index(None, None),
    "convert_to_cpu_index": lambda: inference.convert_to_cpu_index(None),
    "try_gpu": lambda: inference.try_gpu(None, torch.zeros(1, 2), None, 1, False, None),
    "run_pca": lambda: inference.run_pca(torch.zeros(3, 2), 1),
    "FaissKNN": lambda: inference.FaissKNN(),
    "FaissKMeans": lambda: inference.FaissKMeans(),
    "InferenceModel(knn_func='faiss')": lambda: inference.InferenceModel(
        torch.nn.Identity(), knn_func="faiss"
    ),
}


def test_importing_and_searching_without_faiss_imports_no_faiss() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        from pytorch_metric_learning.utils.inference import *
        model = InferenceModel(torch.nn.Identity())
        model.train_knn(torch.randn(10, 3))
        model.get_nearest_neighbors(torch.randn(2, 3), 3)
        print("faiss" in sys.modules, "pytorch_metric_learning_faiss" in sys.modules)
        """
    )
    result = run_python(code)
    assert result.stdout.split() == ["False", "False"]


@pytest.fixture
def plugin_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the registry see no installed backend, as in an environment without the plugin."""
    monkeypatch.setattr(registry._KNN, "_table", {})
    monkeypatch.setattr(registry._KNN, "_loaded", {})
    monkeypatch.setattr(registry._KMEANS, "_table", {})
    monkeypatch.setattr(registry._KMEANS, "_loaded", {})


@pytest.mark.parametrize("name", sorted(CALLS))
def test_faiss_names_raise_the_install_hint_when_the_plugin_is_absent(
    name: str, plugin_not_installed: None
) -> None:
    with pytest.raises(ModuleNotFoundError, match=EXTRA) as caught:
        CALLS[name]()
    assert isinstance(caught.value, BackendNotInstalledError)


@pytest.mark.skipif(PLUGIN_INSTALLED, reason="the faiss plugin is installed")
@pytest.mark.parametrize("name", sorted(CALLS))
def test_faiss_names_raise_the_install_hint_without_the_plugin(name: str) -> None:
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        CALLS[name]()
