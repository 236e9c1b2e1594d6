"""The grid of the worst queries: each query, its top-K retrievals and its nearest relevant
item, framed green when relevant and red when not (:func:`plot_worst_queries`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import torch

from ._validation import invalid
from .errors import InvalidArgumentError, InvalidTypeError
from .worst_queries import (
    Retrieval,
    WorstQuery,
    one_draw,
    queries_metric,
    single_shot_phrase,
    worst_queries_value_kind,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_worst_queries"]

PathLike = Union[str, "os.PathLike[str]"]
Image = Union[PathLike, np.ndarray, torch.Tensor]
OWNER = "plot_worst_queries"
RELEVANT, NOT_RELEVANT, QUERY = "#1a9850", "#d73027", "#4575b4"
_CELL_INCHES = 1.9
_LEGEND = "\nblue: query · green: same label (relevant) · red: other label · {symbol}: {kind}"
_SYMBOLS = {"distance": "d", "similarity": "s"}
# What the values and ranks are under single_gallery_shot (WorstQuery.value_kind).
_SINGLE_SHOT_LEGEND = (
    "\nvalues: chances in [0, 1], not 0/1 outcomes · ranks: among every candidate, before the draw"
)
_ONE_DRAW_LEGEND = (
    "\nvalues: 0/1 outcomes of one random draw · ranks: among every candidate, before the draw"
)


def plot_worst_queries(
    worst: Sequence[WorstQuery],
    path: PathLike,
    query_images: Sequence[Image],
    reference_images: Sequence[Image] | None = None,
    *,
    metric: str | None = None,
    label_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Draw each worst query beside its retrievals and save a PNG.

    One row per query: the query (blue frame), its top-K retrievals (green frame: same
    label; red: not), then, after a gap, its nearest relevant item when it is not in the
    top K. Each retrieval is captioned with its rank, label and distance.

    Args:
        worst: From :func:`pytorch_metric_learning.worst_queries.find_worst_queries`.
        path: The PNG file to write (its name must end in ``.png``: the picture is a PNG,
            and another extension would name a format it is not).
        query_images: One image per query row: a file path, or an array (H x W, H x W x C,
            or a C x H x W tensor): floats in [0, 1] (anything else, NaN included, is
            refused: ``InvalidArgumentError`` naming ``images``), bools, or unsigned ints
            (uint8, uint16, ...: scaled by their type's range).
        reference_images: One per reference row; ``None`` when the reference is the query.
        metric: The metric the queries were ranked by (for the captions). The queries of
            :func:`find_worst_queries` name it themselves, so leave it out; given, it must
            be theirs (``InvalidArgumentError`` otherwise). Queries built by hand without
            a metric are captioned ``precision_at_1``, or ``metric`` when given.
        label_names: Names of the integer labels, if they encode strings: one per label
            shown (a shorter list is refused); long names are cut to the tile's width.
        title: The figure's title (default: the metric, and under single-gallery-shot
            what its values are: "expected over single-shot draws" or "mean of N
            single-shot draws"; the legend below the title then says that the values are
            chances and the ranks count every candidate, whatever the title).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import tempfile
        >>> from pytorch_metric_learning.worst_queries import find_worst_queries
        >>> x, y = torch.tensor([[0.0], [2.0], [3.0], [8.0]]), torch.tensor([0, 0, 1, 1])
        >>> images = [np.full((8, 8), value) for value in (0.1, 0.4, 0.6, 0.9)]
        >>> worst = find_worst_queries(x, y, num_queries=2, k=1)
        >>> out = plot_worst_queries(worst, tempfile.mkdtemp() + "/worst.png", images)
        >>> out.stat().st_size > 0
        True
    """
    from .plots import _new_figure, _save, metric_label

    metric = queries_metric(worst, metric, OWNER) or "precision_at_1"
    _check_path(path)
    _check_label_names(worst, label_names)
    reference_images = query_images if reference_images is None else reference_images
    _check_images(worst, query_images, reference_images)
    if not worst:
        raise InvalidArgumentError(f"The 'worst' parameter of {OWNER} has no query to draw.")
    columns = 1 + max(len(item.retrievals) for item in worst)
    extra = any(item.nearest_relevant.rank > len(item.retrievals) for item in worst)
    widths = [1.0] * columns + ([0.25, 1.0] if extra else [])
    figure = _new_figure(_CELL_INCHES * sum(widths), _CELL_INCHES * 1.3 * len(worst) + 0.4)
    grid = figure.add_gridspec(len(worst), len(widths), width_ratios=widths)
    _space_frames_apart(figure)
    name = metric_label(metric)
    kind = _kind(worst)
    value_kind, draws = worst_queries_value_kind(worst, OWNER)
    legend = _LEGEND.format(symbol=_SYMBOLS[kind], kind=kind)
    values = single_shot_phrase(value_kind, draws)
    if values is not None:
        legend += _ONE_DRAW_LEGEND if one_draw(value_kind, draws) else _SINGLE_SHOT_LEGEND
    default_title = _title(len(worst), name)
    if values is not None:
        default_title += f" ({values})"
    figure.suptitle((title or default_title) + legend, fontsize=12)
    for row, item in enumerate(worst):
        label = _label(item.label, label_names)
        caption = f"query {item.index} · {name} {item.value:.2f}\nlabel {label}"
        _cell(figure.add_subplot(grid[row, 0]), query_images[item.index], caption, QUERY)
        for col, found in enumerate(item.retrievals, start=1):
            axes = figure.add_subplot(grid[row, col])
            _retrieval_cell(axes, found, reference_images, label_names, kind)
        if item.nearest_relevant.rank > len(item.retrievals):
            axes = figure.add_subplot(grid[row, len(widths) - 1])
            _retrieval_cell(axes, item.nearest_relevant, reference_images, label_names, kind)
            axes.set_title("nearest relevant\n" + axes.get_title(), fontsize=9)
    return _save(figure, path)


def _check_path(path: PathLike) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise invalid("path", OWNER, "a file path", type(path).__name__, InvalidTypeError)
    if Path(os.fspath(path)).suffix.lower() != ".png":
        raise invalid("path", OWNER, "a file name ending in .png (the picture is a PNG)", path)


def _check_label_names(worst: Sequence[WorstQuery], names: Sequence[str] | None) -> None:
    if names is None:
        return
    labels = [
        label
        for item in worst
        for label in (
            item.label,
            *(found.label for found in item.retrievals),
            item.nearest_relevant.label,
        )
        if isinstance(label, int) and not isinstance(label, bool)
    ]
    needed = max(labels, default=-1) + 1
    if len(names) < needed or any(label < 0 for label in labels):
        raise invalid(
            "label_names",
            OWNER,
            f"a name for every label shown (labels 0 to {needed - 1}: {needed} names)",
            f"{len(names)} names",
        )


def _title(count: int, name: str) -> str:
    return f"The worst query by {name}" if count == 1 else f"The {count} worst queries by {name}"


def _kind(worst: Sequence[WorstQuery]) -> str:
    kinds = {item.distance_kind for item in worst}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(_SYMBOLS) else "distance"


def _space_frames_apart(figure: Figure) -> None:
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    engine = figure.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine):
        engine.set(wspace=0.06, hspace=0.08)


def _retrieval_cell(
    axes: Axes,
    found: Retrieval,
    images: Sequence[Image],
    label_names: Sequence[str] | None,
    kind: str = "distance",
) -> None:
    colour = RELEVANT if found.relevant else NOT_RELEVANT
    label = _label(found.label, label_names)
    caption = f"#{found.rank} · label {label}\n{_SYMBOLS[kind]} = {found.distance:.3g}"
    _cell(axes, images[found.index], caption, colour)


def _cell(axes: Axes, image: Image, caption: str, colour: str) -> None:
    pixels = _pixels(image)
    axes.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=_top(pixels))
    axes.set_xticks([])
    axes.set_yticks([])
    for spine in axes.spines.values():
        spine.set_edgecolor(colour)
        spine.set_linewidth(5)
    axes.set_title(caption, fontsize=9, color="black")


def _top(pixels: np.ndarray) -> float:
    return 255.0 if pixels.dtype == np.uint8 else 1.0


_CAPTION_CHARS = 16  # a name that, after "#10 · label ", fills one tile's 9-point line


def _label(label: Any, names: Sequence[str] | None) -> str:
    """The label's name (or the label), cut to the tile's width so captions never overlap."""
    text = str(names[label]) if names is not None and isinstance(label, int) else str(label)
    text = " ".join(text.split())  # a newline in a name would push the caption into the tile
    return text if len(text) <= _CAPTION_CHARS else text[: _CAPTION_CHARS - 1] + "…"


def _pixels(image: Image) -> np.ndarray:
    """An image as an H x W or H x W x C array that ``imshow`` draws."""
    if isinstance(image, (str, os.PathLike)):
        return _read(image)
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else image
    if not isinstance(array, np.ndarray):
        raise invalid(
            "images", OWNER, "file paths or arrays", type(image).__name__, InvalidTypeError
        )
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # a C x H x W tensor
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise invalid(
            "images", OWNER, "H x W, H x W x 3/4 or 3/4 x H x W arrays", f"shape {array.shape}"
        )
    return _in_range(array)


def _in_range(array: np.ndarray) -> np.ndarray:
    """uint8 as it is; bools and other unsigned ints scaled to [0, 1] by their type's range;
    floats in [0, 1] as they are, else refused (a silent clip draws a blank tile)."""
    if array.dtype == np.uint8:
        return array
    if array.dtype == np.bool_:
        return array.astype(np.float64)
    if np.issubdtype(array.dtype, np.unsignedinteger):
        return array.astype(np.float64) / np.iinfo(array.dtype).max
    if not np.issubdtype(array.dtype, np.floating):
        raise invalid(
            "images",
            OWNER,
            "floats in [0, 1], bools or unsigned ints",
            array.dtype,
            InvalidTypeError,
        )
    values = array.astype(np.float64)
    if not np.isfinite(values).all() or values.min(initial=0.0) < 0 or values.max(initial=0.0) > 1:
        bad = (
            "NaN or infinite values"
            if not np.isfinite(values).all()
            else (f"values from {values.min():.4g} to {values.max():.4g}")
        )
        raise invalid(
            "images", OWNER, "float images with values in [0, 1] (divide by 255 first?)", bad
        )
    return values


def _read(path: PathLike) -> np.ndarray:
    from matplotlib.image import imread

    try:
        return np.asarray(imread(os.fspath(path)))
    except (OSError, ValueError, SyntaxError) as error:
        raise InvalidArgumentError(
            f"The image '{os.fspath(path)}' named in the 'images' of {OWNER} cannot be read: "
            f"{error}"
        ) from error


def _check_images(
    worst: Sequence[WorstQuery], query_images: Sequence[Image], reference_images: Sequence[Image]
) -> None:
    needed_query = max((item.index for item in worst), default=-1) + 1
    needed_reference = (
        max(
            (found.index for item in worst for found in [*item.retrievals, item.nearest_relevant]),
            default=-1,
        )
        + 1
    )
    for param, images, needed in (
        ("query_images", query_images, needed_query),
        ("reference_images", reference_images, needed_reference),
    ):
        if isinstance(images, (str, bytes)) or not hasattr(images, "__len__"):
            raise invalid(
                param, OWNER, "a sequence of images", type(images).__name__, InvalidTypeError
            )
        if len(images) < needed:
            raise invalid(param, OWNER, f"at least {needed} images (one per row)", len(images))
