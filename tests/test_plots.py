"""Each plot function writes a non-empty PNG, and matplotlib loads only when plotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from pytorch_metric_learning import plots  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 1000


def test_training_curves(tmp_path: Path) -> None:
    out = plots.plot_training_curves(
        {"iteration": [0, 1, 2, 3], "total_loss": [3.0, 2.0, 1.5, 1.4]},
        {"epoch": [1, 2], "precision_at_1_level0": [0.7, 0.8], "NMI_level0": [0.5, 0.6]},
        tmp_path / "nested" / "curves.png",
        best_epoch=2,
    )
    assert out == tmp_path / "nested" / "curves.png"
    assert_png(out)


def test_training_curves_with_empty_histories(tmp_path: Path) -> None:
    assert_png(plots.plot_training_curves({}, {}, tmp_path / "empty.png"))


def test_importing_the_module_does_not_import_matplotlib() -> None:
    code = (
        "import sys, pytorch_metric_learning.plots, pytorch_metric_learning.evaluation; "
        "assert 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in sys.modules if name.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r"pytorch-metric-learning\[plots\]"):
        plots.plot_training_curves({}, {}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
