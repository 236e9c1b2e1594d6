"""Every docstring example of the core package runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import pytorch_metric_learning

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(
        pytorch_metric_learning.__path__, prefix="pytorch_metric_learning."
    )
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
