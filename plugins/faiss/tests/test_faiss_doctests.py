"""The docstring examples of the plugin's modules run."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.faiss

MODULES = [
    "pytorch_metric_learning_faiss._gpu",
    "pytorch_metric_learning_faiss.index_helpers",
    "pytorch_metric_learning_faiss.kmeans",
    "pytorch_metric_learning_faiss.knn",
    "pytorch_metric_learning_faiss.pca",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
