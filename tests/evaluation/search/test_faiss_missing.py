"""Without the faiss plugin the Faiss names still import, and constructing them says what to install.

Runs in the core-only environment (the nox ``tests`` session); skipped where the plugin is
installed.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from test_install_hint import expected_hint

from _subprocess import run_python
from pytorch_metric_learning import evaluation
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.errors import BackendNotInstalledError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pytorch_metric_learning_faiss") is not None,
    reason="the faiss plugin is installed",
)

# The pip command for this installation: the checkout's plugin folder for an editable core.
EXTRA = re.escape(expected_hint())


@pytest.mark.parametrize("name", ["FaissKNN", "FaissKMeans"])
def test_constructing_without_the_plugin_names_the_extra(name: str) -> None:
    from pytorch_metric_learning.evaluation import FaissKMeans, FaissKNN

    cls = {"FaissKNN": FaissKNN, "FaissKMeans": FaissKMeans}[name]
    with pytest.raises(ModuleNotFoundError, match=EXTRA) as caught:
        cls()
    assert isinstance(caught.value, BackendNotInstalledError)


def test_constructing_with_arguments_still_names_the_extra() -> None:
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        evaluation.FaissKNN(reset_before=False, index="HNSW32")
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        evaluation.FaissKMeans(seed=0)


def test_faiss_is_not_a_listed_backend() -> None:
    assert "faiss" not in evaluation.list_knn_backends()
    assert "faiss" not in evaluation.list_kmeans_backends()


@pytest.mark.parametrize("spec", ["faiss", {"name": "faiss", "index": "HNSW32"}])
def test_loading_by_name_names_the_extra(spec: object) -> None:
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        evaluation.load_knn_func(spec)
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        evaluation.load_kmeans_func("faiss")


def test_isinstance_is_false_without_the_plugin() -> None:
    assert not isinstance(object(), evaluation.FaissKNN)
    assert not isinstance(evaluation.CustomKNN(CosineSimilarity()), evaluation.FaissKNN)


def test_importing_evaluation_imports_no_faiss() -> None:
    code = (
        "import sys; from pytorch_metric_learning.evaluation import FaissKNN, FaissKMeans; "
        "print('faiss' in sys.modules, 'pytorch_metric_learning_faiss' in sys.modules)"
    )
    result = run_python(code)
    assert result.stdout.split() == ["False", "False"]
