"""Each plot function writes a non-empty PNG, and matplotlib loads only when plotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import torch  # noqa: E402

from pytorch_metric_learning import plots  # noqa: E402
from pytorch_metric_learning.evaluation import (
    recall_at_false_match_rate,  # noqa: E402
)
from pytorch_metric_learning.evaluation.search import _install_hint  # noqa: E402

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


@pytest.fixture
def pairs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    same = torch.rand(500, generator=generator) < 0.3
    similarities = torch.where(same, 0.7, 0.2) + 0.2 * torch.randn(500, generator=generator)
    return similarities, same


@pytest.mark.parametrize(
    "draw", [plots.plot_threshold_curve, plots.plot_roc, plots.plot_det, plots.plot_verification]
)
@pytest.mark.parametrize("threshold", [None, 0.45])
def test_threshold_plots(tmp_path: Path, pairs, draw, threshold) -> None:
    similarities, same = pairs
    out = draw(similarities, same, tmp_path / "plot.png", is_inverted=True, threshold=threshold)
    assert_png(out)


@pytest.mark.parametrize(
    "draw", [plots.plot_threshold_curve, plots.plot_roc, plots.plot_det, plots.plot_verification]
)
def test_threshold_plots_of_distances_from_numpy(tmp_path: Path, pairs, draw) -> None:
    similarities, same = pairs
    distances = (1 - similarities).numpy()
    assert_png(draw(distances, same.numpy(), tmp_path / "plot.png", is_inverted=False))


def test_custom_metric_and_title(tmp_path: Path, pairs) -> None:
    similarities, same = pairs
    out = plots.plot_threshold_curve(
        similarities,
        same,
        tmp_path / "tar.png",
        is_inverted=True,
        metric=recall_at_false_match_rate(0.01),
        title="TAR at 1% FAR",
    )
    assert_png(out)


def test_invalid_pairs_raise_before_drawing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both True and False"):
        plots.plot_roc(
            torch.rand(4), torch.ones(4, dtype=torch.bool), tmp_path / "x.png", is_inverted=True
        )
    assert not (tmp_path / "x.png").exists()


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
    # The hint for this installation (a checkout's own: tests/evaluation/search/test_install_hint.py).
    monkeypatch.setattr(_install_hint, "source_checkout", lambda: None)
    with pytest.raises(ModuleNotFoundError, match=r"-m pip install 'matplotlib>=3\.5'"):
        plots.plot_training_curves({}, {}, tmp_path / "x.png")
    with pytest.raises(plots.PlotsNotInstalledError):
        plots.plot_roc(torch.rand(4), torch.arange(4) < 2, tmp_path / "x.png", is_inverted=True)
    assert not (tmp_path / "x.png").exists()


# Written out as papers and legends write them (not read from the library).
LABELS = {
    "precision_at_1_level0": "Precision@1",
    "mean_average_precision_at_r_level0": "MAP@R",
    "r_precision_level0": "R-precision",
    "NMI_level0": "NMI",
    "AMI_level1": "AMI (level 1)",
    "mean_average_precision": "MAP",
    "mean_reciprocal_rank": "MRR",
    "recall_at_4": "Recall@4",
    "precision_at_10": "Precision@10",
    "mean_average_precision_at_8": "MAP@8",
    "ndcg_at_100_level0": "NDCG@100",
    "total_loss": "total loss",
    "my_custom_metric": "my custom metric",
}


@pytest.mark.parametrize("key", sorted(LABELS))
def test_metric_labels_are_readable(key: str) -> None:
    assert plots.metric_label(key) == LABELS[key]


def test_training_curves_legend_uses_readable_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    original = plots._draw_series

    def spy(axes, history, x_key, y_label):  # type: ignore[no-untyped-def]
        original(axes, history, x_key, y_label)
        seen.extend(line.get_label() for line in axes.get_lines())

    monkeypatch.setattr(plots, "_draw_series", spy)
    plots.plot_training_curves(
        {"iteration": [0, 1], "total_loss": [2.0, 1.0]},
        {"epoch": [1, 2], "mean_average_precision_at_r_level0": [0.5, 0.6]},
        tmp_path / "curves.png",
    )
    assert seen == ["total loss", "MAP@R"]
