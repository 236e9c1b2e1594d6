"""PNG plots of training runs and verification thresholds (the ``plots`` extra).

matplotlib is imported only when a plot is drawn, and figures are rendered with its Agg
canvas directly, so plotting needs no display and never changes the pyplot backend of the
calling program (a notebook keeps its own).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import torch

from ._atomic import atomic_write
from ._metric_catalog import parametrized_parts
from ._worst_queries_plot import plot_worst_queries
from .errors import PMLError
from .evaluation.search._install_hint import extra_install_hint
from .evaluation.verification.operating_points import ThresholdCurve, threshold_curve
from .evaluation.verification.thresholds import Metric, match_f1

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PlotsNotInstalledError",
    "plot_training_curves",
    "plot_threshold_curve",
    "plot_roc",
    "plot_det",
    "plot_verification",
    "plot_worst_queries",
    "metric_label",
]

PathLike = Union[str, "os.PathLike[str]"]


class PlotsNotInstalledError(PMLError, ModuleNotFoundError):
    """matplotlib, which every plot needs, is not installed."""


def plot_training_curves(
    loss_history: Mapping[str, Sequence[float]],
    accuracy_history: Mapping[str, Sequence[float]],
    path: PathLike,
    *,
    best_epoch: int | None = None,
    title: str = "Training",
) -> Path:
    """Draw losses per iteration beside validation metrics per epoch, and save a PNG.

    Args:
        loss_history: ``{"iteration": [...], <loss name>: [...], ...}``, as returned by
            ``HookContainer.get_loss_history()`` (2.x's ``"~iteration~"`` is not drawn).
        accuracy_history: ``{"epoch": [...], <metric key>: [...], ...}``, as returned by
            ``HookContainer.get_accuracy_history(tester, "val", return_all_metrics=True)``
            (its ``best_epoch``/``best_accuracy`` summaries are not drawn as series).
        path: The PNG file to write (parent folders are created).
        best_epoch: If given, marked with a vertical line on the metrics panel.
        title: The figure's title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import tempfile
        >>> out = plot_training_curves(
        ...     {"iteration": [0, 1, 2], "total_loss": [2.0, 1.5, 1.2]},
        ...     {"epoch": [1, 2], "precision_at_1_level0": [0.8, 0.9]},
        ...     tempfile.mkdtemp() + "/curves.png",
        ...     best_epoch=2,
        ... )
        >>> out.stat().st_size > 0
        True
    """
    figure = _new_figure(10.0, 4.0)
    loss_axes, metric_axes = figure.subplots(1, 2)
    _draw_series(loss_axes, loss_history, "iteration", "loss")
    _draw_series(metric_axes, accuracy_history, "epoch", "validation metric")
    if best_epoch is not None:
        metric_axes.axvline(
            best_epoch, color="0.5", linestyle="--", label=f"best (epoch {best_epoch})"
        )
        metric_axes.legend(loc="lower right", fontsize="small")
    figure.suptitle(title)
    return _save(figure, path)


def plot_threshold_curve(
    scores: Any,
    labels: Any,
    path: PathLike,
    *,
    is_inverted: bool,
    metric: Metric = match_f1,
    metric_name: str | None = None,
    threshold: float | None = None,
    title: str | None = None,
) -> Path:
    """Draw a metric against every candidate threshold of the pairs, and save a PNG.

    Args:
        scores: One distance or similarity per pair (as for ``select_threshold``).
        labels: True where the pair should match.
        path: The PNG file to write (parent folders are created).
        is_inverted: True when larger scores mean more alike (similarities).
        metric: A threshold metric such as ``match_f1`` (the default).
        metric_name: The metric's name or key (``f1``, ``tar@far=0.01``), shown through
            :func:`metric_label` (``F1``, ``TAR@FAR=1%``); default: derived from ``metric``.
        threshold: If given, marked with a vertical line (a chosen threshold, say).
        title: The figure's title.

    Example:
        >>> import tempfile, torch
        >>> scores = torch.tensor([0.9, 0.8, 0.4, 0.3])
        >>> same = torch.tensor([True, True, False, True])
        >>> out = plot_threshold_curve(
        ...     scores, same, tempfile.mkdtemp() + "/f1.png", is_inverted=True, threshold=0.6
        ... )
        >>> out.stat().st_size > 0
        True
    """
    curve = threshold_curve(scores, labels, is_inverted=is_inverted)
    figure = _new_figure(5.5, 4.0)
    _draw_metric(figure.subplots(), curve, metric, _metric_name(metric, metric_name), threshold)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_roc(
    scores: Any, labels: Any, path: PathLike, *, is_inverted: bool,
    threshold: float | None = None, title: str | None = None,
) -> Path:  # fmt: skip
    """Draw the ROC curve (true match rate against false match rate), and save a PNG.

    The false match rate axis is logarithmic, where verification systems operate; the
    operating point of ``threshold``, if given, is marked.

    Example:
        >>> import tempfile, torch
        >>> scores = torch.tensor([0.1, 0.2, 0.7, 0.4])
        >>> same = torch.tensor([True, True, False, False])
        >>> plot_roc(scores, same, tempfile.mkdtemp() + "/roc.png", is_inverted=False).exists()
        True
    """
    return _plot_rates(_draw_roc, scores, labels, path, is_inverted, threshold, title)


def plot_det(
    scores: Any, labels: Any, path: PathLike,
    *, is_inverted: bool, threshold: float | None = None, title: str | None = None,
) -> Path:  # fmt: skip
    """Draw the DET curve (false non-match rate against false match rate), and save a PNG.

    Both axes use the normal deviate scale, on which the errors of two normally
    distributed score populations form a straight line.

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mkdtemp() + "/det.png"
        >>> scores = torch.tensor([0.1, 0.2, 0.7, 0.4])
        >>> plot_det(scores, torch.tensor([True, True, False, False]), path, is_inverted=False).name
        'det.png'
    """
    return _plot_rates(_draw_det, scores, labels, path, is_inverted, threshold, title)


def plot_verification(
    scores: Any, labels: Any, path: PathLike, *, is_inverted: bool, metric: Metric = match_f1,
    metric_name: str | None = None, threshold: float | None = None, title: str | None = None,
) -> Path:  # fmt: skip
    """The three views of a verification threshold side by side: metric, ROC and DET.

    Takes the arguments of :func:`plot_threshold_curve`.

    Example:
        >>> import tempfile, torch
        >>> scores = torch.tensor([0.9, 0.8, 0.4, 0.3, 0.2])
        >>> same = torch.tensor([True, True, False, True, False])
        >>> out = plot_verification(
        ...     scores, same, tempfile.mkdtemp() + "/all.png", is_inverted=True, threshold=0.35
        ... )
        >>> out.read_bytes()[:4] == b"\\x89PNG"
        True
    """
    curve = threshold_curve(scores, labels, is_inverted=is_inverted)
    point = _operating_point(scores, labels, is_inverted, threshold)
    figure = _new_figure(15.0, 4.2)
    metric_axes, roc_axes, det_axes = figure.subplots(1, 3)
    _draw_metric(metric_axes, curve, metric, _metric_name(metric, metric_name), threshold)
    _draw_roc(roc_axes, _rates(curve), point)
    _draw_det(det_axes, _rates(curve), point)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def _plot_rates(
    draw: Callable[[Any, _Rates, tuple[float, float] | None], None],
    scores: Any,
    labels: Any,
    path: PathLike,
    is_inverted: bool,
    threshold: float | None,
    title: str | None,
) -> Path:
    """One figure of error rates (ROC or DET), drawn by ``draw``, saved as a PNG."""
    curve = threshold_curve(scores, labels, is_inverted=is_inverted)
    figure = _new_figure(5.5, 4.0)
    draw(figure.subplots(), _rates(curve), _operating_point(scores, labels, is_inverted, threshold))
    if title:
        figure.suptitle(title)
    return _save(figure, path)


class _Rates(NamedTuple):
    false_match: torch.Tensor
    true_match: torch.Tensor
    positives: int
    negatives: int


def _rates(curve: ThresholdCurve) -> _Rates:
    tp, fp, tn, fn = curve.counts
    positives, negatives = int(tp[-1] + fn[-1]), int(fp[-1] + tn[-1])
    return _Rates(fp / max(negatives, 1), tp / max(positives, 1), positives, negatives)


def _operating_point(
    scores: Any, labels: Any, is_inverted: bool, threshold: float | None
) -> tuple[float, float] | None:
    """``(false match rate, true match rate)`` of the decisions at ``threshold``."""
    if threshold is None:
        return None
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
    labels = torch.as_tensor(labels, dtype=torch.bool).flatten()
    decided = scores >= threshold if is_inverted else scores <= threshold
    negatives, positives = int((~labels).sum()), int(labels.sum())
    false_match = float((decided & ~labels).sum()) / max(negatives, 1)
    return false_match, float((decided & labels).sum()) / max(positives, 1)


def _metric_name(metric: Metric, given: str | None) -> str:
    """The readable label of the metric: of ``given`` if any, else of the function's name."""
    name = given or getattr(metric, "__name__", None)
    return metric_label(name) if name else repr(metric)


def _draw_metric(
    axes: Axes, curve: ThresholdCurve, metric: Metric, name: str, threshold: float | None
) -> None:
    values = metric(curve.counts)
    finite = torch.isfinite(curve.thresholds)
    axes.plot(curve.thresholds[finite].tolist(), values[finite].tolist(), linewidth=1.2)
    if threshold is not None and abs(threshold) != float("inf"):
        axes.axvline(threshold, color="C3", linestyle="--", label=f"threshold {threshold:.4g}")
        axes.legend(loc="best", fontsize="small")
    axes.set_xlabel("threshold")
    axes.set_ylabel(name)
    axes.set_title(f"{name} against the threshold")
    axes.grid(alpha=0.3)


def _draw_roc(axes: Axes, rates: _Rates, point: tuple[float, float] | None) -> None:
    axes.plot(rates.false_match.tolist(), rates.true_match.tolist(), linewidth=1.2)
    if rates.negatives > 0 and bool((rates.false_match > 0).any()):
        axes.set_xscale("log")
        axes.set_xlim(0.5 / rates.negatives, 1.0)
    if point is not None:
        _draw_roc_point(axes, rates, point)
    axes.set_xlabel("false match rate")
    axes.set_ylabel("true match rate")
    axes.set_title("ROC")
    axes.grid(alpha=0.3, which="both")


def _draw_roc_point(axes: Axes, rates: _Rates, point: tuple[float, float]) -> None:
    """The threshold's operating point; at a false match rate of 0 on the log axis, at the
    axis's left edge (where 0 would be), said so in the legend."""
    false_match, true_match = point
    label = "threshold"
    if false_match == 0 and axes.get_xscale() == "log":
        false_match = axes.get_xlim()[0]
        label = "threshold (false match rate 0, at the left edge)"
    axes.plot(false_match, true_match, "o", color="C3", label=label, clip_on=False, zorder=3)
    axes.legend(loc="lower right", fontsize="small")


_DET_TICKS = (0.001, 0.01, 0.05, 0.2, 0.5, 0.8, 0.95)


def _draw_det(axes: Axes, rates: _Rates, point: tuple[float, float] | None) -> None:
    smallest = 0.5 / max(rates.positives, rates.negatives, 2)

    def deviate(rate: Any) -> torch.Tensor:
        rate = torch.as_tensor(rate, dtype=torch.float64).clamp(smallest, 1 - smallest)
        return torch.special.ndtri(rate)

    false_non_match = 1 - rates.true_match
    inside = (rates.false_match > 0) & (rates.false_match < 1)
    inside &= (false_non_match > 0) & (false_non_match < 1)
    axes.plot(
        deviate(rates.false_match[inside]).tolist(),
        deviate(false_non_match[inside]).tolist(),
        linewidth=1.2,
    )
    ticks = [tick for tick in _DET_TICKS if tick >= smallest]
    positions = deviate(ticks).tolist()
    labels = [f"{100 * tick:g}%" for tick in ticks]
    x_ticks, y_ticks = (positions, labels), (positions, labels)
    if point is not None:
        # A rate of 0 has no normal deviate: drawn at the edge, where a "0" tick marks it.
        edge = float(deviate(0.0))
        x, y = float(deviate(point[0])), float(deviate(1 - point[1]))
        axes.plot(x, y, "o", color="C3", label=_det_point_label(point), clip_on=False, zorder=3)
        axes.legend(loc="upper right", fontsize="small")
        with_zero = _ticks_with_zero(edge, positions, labels)
        if point[0] == 0:
            x_ticks = with_zero
        if point[1] == 1:
            y_ticks = with_zero
        low = min(edge, *positions)
        axes.set_xlim(left=low - 0.1)
        axes.set_ylim(bottom=low - 0.1)
    axes.set_xticks(*x_ticks)
    axes.set_yticks(*y_ticks)
    axes.set_xlabel("false match rate")
    axes.set_ylabel("false non-match rate")
    axes.set_title("DET")
    axes.grid(alpha=0.3)


def _ticks_with_zero(
    edge: float, positions: list[float], labels: list[str]
) -> tuple[list[float], list[str]]:
    """A "0" tick at the edge, without the ticks too close to it to read."""
    kept = [(at, label) for at, label in zip(positions, labels) if at - edge > 0.4]
    return [edge, *(at for at, _ in kept)], ["0", *(label for _, label in kept)]


def _det_point_label(point: tuple[float, float]) -> str:
    zero = [
        name
        for name, rate in (("false match", point[0]), ("false non-match", 1 - point[1]))
        if rate == 0
    ]
    return f"threshold ({' and '.join(zero)} rate 0, at the edge)" if zero else "threshold"


# Columns of the hooks' histories that are steps or summaries, not series to draw.
_BOOKKEEPING = frozenset({"iteration", "~iteration~", "epoch", "best_epoch", "best_accuracy"})


def _draw_series(
    axes: Axes, history: Mapping[str, Sequence[float]], x_key: str, y_label: str
) -> None:
    x = list(history.get(x_key, []))
    for name, values in history.items():
        if name != x_key and name not in _BOOKKEEPING:
            axes.plot(
                x,
                list(values),
                marker="o" if len(x) < 40 else None,
                markersize=3,
                label=metric_label(name),
            )
    axes.set_xlabel(x_key)
    axes.set_ylabel(y_label)
    axes.xaxis.set_major_locator(_integer_locator())
    axes.grid(alpha=0.3)
    if len(history) > 1:
        axes.legend(loc="best", fontsize="small")


_LABELS = {
    "precision_at_1": "Precision@1",
    "r_precision": "R-precision",
    "mean_average_precision_at_r": "MAP@R",
    "mean_average_precision": "MAP",
    "mean_reciprocal_rank": "MRR",
    "NMI": "NMI",
    "AMI": "AMI",
    "f1": "F1",
    "match_f1": "F1",
    "accuracy": "accuracy",
    "match_accuracy": "accuracy",
    "balanced_accuracy": "balanced accuracy",
    "match_balanced_accuracy": "balanced accuracy",
}
_FAMILY_LABELS = {
    "recall": "Recall",
    "precision": "Precision",
    "mean_average_precision": "MAP",
    "ndcg": "NDCG",
}


def metric_label(key: str) -> str:
    """A readable label for a metric or loss key, as papers and legends write it.

    ``_level0`` (the only level of a single-level record) is dropped, and another level
    is kept as ``(level 1)``; a name this module does not know keeps its words.

    Example:
        >>> metric_label("mean_average_precision_at_r_level0")
        'MAP@R'
        >>> metric_label("recall_at_4"), metric_label("precision_at_1_level1")
        ('Recall@4', 'Precision@1 (level 1)')
        >>> metric_label("total_loss"), metric_label("f1"), metric_label("tar@far=0.001")
        ('total loss', 'F1', 'TAR@FAR=0.1%')
    """
    name, level = key, ""
    match = _LEVEL.fullmatch(key)
    if match is not None:
        name = match.group(1)
        level = "" if match.group(2) == "0" else f" (level {match.group(2)})"
    parts = parametrized_parts(name)
    tar_at_far = _TAR_AT_FAR.fullmatch(name)
    if name in _LABELS:
        label = _LABELS[name]
    elif parts is not None:
        label = f"{_FAMILY_LABELS[parts[0]]}@{parts[1]}"
    elif tar_at_far is not None:
        label = f"TAR@FAR={float(tar_at_far.group(1)) * 100:g}%"
    else:
        label = name.replace("_", " ")
    return label + level


_LEVEL = re.compile(r"(.+)_level([0-9]+)")
# pml-eval threshold's name of "true match rate at a false match rate" (tar@far=0.001)
_TAR_AT_FAR = re.compile(r"tar@far=([0-9.]+(?:e-?[0-9]+)?)", re.IGNORECASE)


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _new_figure(width: float, height: float) -> Figure:
    """A figure on its own Agg canvas: headless, and independent of ``pyplot``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError as error:
        raise PlotsNotInstalledError(
            "Plots need matplotlib, which is not installed. Install it with: "
            f"{extra_install_hint('plots')}",
            name="matplotlib",
        ) from error
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: PathLike) -> Path:
    """Write the PNG atomically: a failed save leaves any earlier plot at ``path`` intact;
    a FIFO or a device is written in place, never replaced (see ``_atomic``)."""
    return atomic_write(
        path, lambda handle: figure.savefig(handle, format="png", dpi=120), in_place=True
    )
