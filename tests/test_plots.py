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
    # pml-eval threshold's metric names, and the threshold metric functions'
    "f1": "F1",
    "balanced_accuracy": "balanced accuracy",
    "tar@far=0.001": "TAR@FAR=0.1%",
    "tar@far=0.0": "TAR@FAR=0%",
    "match_f1": "F1",
    "match_balanced_accuracy": "balanced accuracy",
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


def _drawn_figure(monkeypatch: pytest.MonkeyPatch, draw) -> object:  # type: ignore[no-untyped-def]
    """The matplotlib figure ``draw()`` saves."""
    saved = []
    original = plots._save

    def spy(figure, path):  # type: ignore[no-untyped-def]
        saved.append(figure)
        return original(figure, path)

    monkeypatch.setattr(plots, "_save", spy)
    draw()
    return saved[0]


# (metric_name given, or None) -> the label the metric panel must show
PANEL_LABELS = [
    ("f1", "F1"),
    ("tar@far=0.1", "TAR@FAR=10%"),
    ("balanced_accuracy", "balanced accuracy"),
    ("mean_average_precision_at_r", "MAP@R"),
    (None, "F1"),
]


@pytest.mark.parametrize(("name", "label"), PANEL_LABELS)
def test_the_metric_panel_uses_readable_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str | None, label: str
) -> None:
    scores = torch.tensor([0.9, 0.8, 0.4, 0.3, 0.2])
    same = torch.tensor([True, True, False, True, False])
    for draw in (plots.plot_verification, plots.plot_threshold_curve):
        figure = _drawn_figure(
            monkeypatch,
            lambda draw=draw: draw(
                scores, same, tmp_path / "x.png", is_inverted=True, metric_name=name, threshold=0.5
            ),
        )
        metric_axes = figure.axes[0]  # type: ignore[attr-defined]
        assert metric_axes.get_ylabel() == label
        assert metric_axes.get_title() == f"{label} against the threshold"
        monkeypatch.undo()


def _pairs_separated(negatives: int, positives: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Similarities: every match scores above every non-match, so the best threshold has
    no false match."""
    scores = torch.cat([torch.linspace(0.6, 1.0, positives), torch.linspace(0.0, 0.5, negatives)])
    return scores, torch.arange(positives + negatives) < positives


def _threshold_dots(axes) -> list:  # type: ignore[no-untyped-def]
    return [line for line in axes.get_lines() if line.get_marker() == "o"]


@pytest.mark.parametrize(("negatives", "positives"), [(3000, 300), (400, 60), (50, 5)])
def test_a_threshold_without_false_matches_is_drawn_on_roc_and_det(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, negatives: int, positives: int
) -> None:
    scores, same = _pairs_separated(negatives, positives)
    threshold = 0.55  # between the two groups: false match rate 0, true match rate 1
    labels = same.tolist()
    assert sum(s >= threshold and not m for s, m in zip(scores.tolist(), labels)) == 0
    figure = _drawn_figure(
        monkeypatch,
        lambda: plots.plot_verification(
            scores, same, tmp_path / "v.png", is_inverted=True, threshold=threshold
        ),
    )
    _, roc, det = figure.axes  # type: ignore[attr-defined]
    (dot,) = _threshold_dots(roc)
    (x,), (y,) = dot.get_xdata(), dot.get_ydata()
    left, right = roc.get_xlim()
    assert left <= x <= right and x > 0  # on the log axis, at its left edge
    assert x == pytest.approx(left) and y == 1.0
    assert "false match rate 0" in dot.get_label()
    (dot,) = _threshold_dots(det)
    (x,), (y,) = dot.get_xdata(), dot.get_ydata()
    ticks = dict(zip(det.get_xticks(), (t.get_text() for t in det.get_xticklabels())))
    assert ticks[x] == "0"  # on the grid line of the "0" tick
    y_ticks = dict(zip(det.get_yticks(), (t.get_text() for t in det.get_yticklabels())))
    assert y_ticks[y] == "0"  # and no false non-match either
    assert det.get_xlim()[0] < x and det.get_ylim()[0] < y  # inside the axes


def test_a_threshold_with_false_matches_is_drawn_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    same = torch.tensor([True, False, True, True, False, False, True, False])
    figure = _drawn_figure(
        monkeypatch,
        lambda: plots.plot_verification(
            scores, same, tmp_path / "v.png", is_inverted=True, threshold=0.55
        ),
    )
    (dot,) = _threshold_dots(figure.axes[1])  # type: ignore[attr-defined]
    # decided: 0.9 0.8 0.7 0.6 -> 1 of the 4 non-matches, 3 of the 4 matches
    assert (dot.get_xdata()[0], dot.get_ydata()[0]) == (0.25, 0.75)
    assert dot.get_label() == "threshold"


def test_training_curves_take_the_hooks_full_histories(tmp_path: Path) -> None:
    """Every column the hooks return: 2.x's ``~iteration~``, the best-epoch summaries."""
    from pytorch_metric_learning.utils import logging_presets

    record_keeper, _, _ = logging_presets.get_record_keeper(str(tmp_path / "logs"))
    hooks = logging_presets.get_hook_container(record_keeper)
    for step in (1, 2):
        record_keeper.update_records({"total_loss": 1.0 / step}, step, "loss_histories")
    record_keeper.save_records()
    losses = hooks.get_loss_history()
    assert "~iteration~" in losses
    accuracies = {"epoch": [1, 2], "best_epoch": 2, "best_accuracy": 0.8, "p": [0.4, 0.8]}
    assert_png(plots.plot_training_curves(losses, accuracies, tmp_path / "c.png"))
    record_keeper.close()
