"""Every docstring example of the core package runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import pytorch_metric_learning
from pytorch_metric_learning._missing_2x import MISSING_MODULES

# The 2.x modules this library lacks raise on import (tests/compat/test_missing_2x.py).
ABSENT = {f"pytorch_metric_learning.{name}" for name in MISSING_MODULES}
# Modules of an optional extra: (module, the library it needs), skipped without it.
NEEDS = {"pytorch_metric_learning.integrations.lightning": "lightning"}
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(
        pytorch_metric_learning.__path__, prefix="pytorch_metric_learning."
    )
    if info.name not in ABSENT
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
