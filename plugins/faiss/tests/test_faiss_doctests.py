"""The docstring examples of the plugin's modules run."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.faiss

MODULES = ["_gpu", "index_helpers", "kmeans", "knn", "pca"]  # of pytorch_metric_learning_faiss


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"pytorch_metric_learning_faiss.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
