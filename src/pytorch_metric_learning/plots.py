"""PNG plots of training runs and verification thresholds (the ``plots`` extra).

matplotlib is imported only when a plot is drawn, and figures are rendered with its Agg
canvas directly, so plotting needs no display and never changes the pyplot backend of the
calling program (a notebook keeps its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from .errors import PMLError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PlotsNotInstalledError", "plot_training_curves"]

PathLike = Union[str, "os.PathLike[str]"]
INSTALL_HINT = 'pip install "pytorch-metric-learning[plots]"'


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
            ``HookContainer.get_loss_history()``.
        accuracy_history: ``{"epoch": [...], <metric key>: [...], ...}``, as returned by
            ``HookContainer.get_accuracy_history(tester, "val", return_all_metrics=True)``.
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


def _draw_series(
    axes: Axes, history: Mapping[str, Sequence[float]], x_key: str, y_label: str
) -> None:
    x = list(history.get(x_key, []))
    for name, values in history.items():
        if name != x_key:
            axes.plot(
                x,
                list(values),
                marker="o" if len(x) < 40 else None,
                markersize=3,
                label=_short(name),
            )
    axes.set_xlabel(x_key)
    axes.set_ylabel(y_label)
    axes.xaxis.set_major_locator(_integer_locator())
    axes.grid(alpha=0.3)
    if len(history) > 1:
        axes.legend(loc="best", fontsize="small")


def _short(key: str) -> str:
    """``precision_at_1_level0`` -> ``precision_at_1`` (single-level keys only)."""
    return key[: -len("_level0")] if key.endswith("_level0") else key


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
            f"Plots need matplotlib, which is not installed. Install it with: {INSTALL_HINT}",
            name="matplotlib",
        ) from error
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=120)
    return path
