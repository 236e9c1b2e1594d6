"""Without lightning, the integration module says which extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from pytorch_metric_learning.errors import PMLError

MODULE = "pytorch_metric_learning.integrations.lightning"
ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_integration_without_lightning_names_the_extra(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "lightning" or m.startswith("lightning.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lightning", None)  # import lightning -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    with pytest.raises(ModuleNotFoundError, match="the 'lightning' extra") as caught:
        importlib.import_module(MODULE)
    assert isinstance(caught.value, PMLError)
    assert caught.value.name == "lightning"
    assert "install" in str(caught.value) and "lightning" in str(caught.value)
    # this checkout has constraints.txt (torch and lightning pinned): the command uses it
    assert f"-c {ROOT / 'constraints.txt'}" in str(caught.value)


def test_the_library_imports_without_lightning() -> None:
    """In a fresh interpreter where ``import lightning`` fails: nothing else needs it."""
    code = (
        "import sys; sys.modules['lightning'] = None\n"
        "import pytorch_metric_learning.evaluation.distributed as d, "
        "pytorch_metric_learning.integrations\n"
        "assert d.AccuracyAccumulator"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
