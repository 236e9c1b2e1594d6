"""``evaluate --query-categories`` and ``--show-worst``: the metrics per category, and the
queries the model fails worst on (a table, a JSON list, and with ``--images`` a picture)."""

from __future__ import annotations

import argparse
import collections
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._worst_queries_plot import plot_worst_queries
from ..evaluation.retrieval import PerQueryValues
from ..worst_queries import (
    WorstQuery,
    find_worst_queries,
    queries_metric,
    worst_queries_header,
    worst_queries_note,
    worst_queries_rows,
    worst_queries_value_kind,
)
from ._output import format_table, say_written
from .loaders import CATEGORIES, InputFileError, read_label_like

__all__ = [
    "read_categories",
    "render_categories",
    "category_record",
    "category_counts",
    "CategoryCounts",
    "read_image_paths",
    "reusable_per_query",
    "worst_queries",
    "render_worst",
    "worst_record",
    "draw_worst",
    "read_worst_images",
]


def read_categories(source: str | None, num_rows: int) -> list[Any] | None:
    """One category per query, read like a labels file (ints or names; errors name the
    option)."""
    if source is None:
        return None
    return list(read_label_like(source, num_rows, CATEGORIES).tolist())


WRONG_MARK = " (!)"  # as the overall table marks a metric --k made wrong


def render_categories(
    per_category: dict[Any, dict[str, Any]],
    counts: CategoryCounts,
    wrong: Sequence[str] = (),
) -> str:
    """One row per category: the queries its metrics average over, the queries left out
    (no valid relevant reference, as the overall count leaves them out), and each metric
    on its queries alone; the metrics in ``wrong`` (--k below the largest class) marked
    as in the overall table."""
    names = list(next(iter(per_category.values()))) if per_category else []
    rows = [
        [category, counts.scored[category], counts.left_out[category]]
        + [values[name] for name in names]
        for category, values in per_category.items()
    ]
    header = [f"{name}{WRONG_MARK}" if name in wrong else name for name in names]
    table = format_table(["category", "queries", "left out", *header], rows)
    if any(name in wrong for name in names):
        table += f"\n\n{WRONG_MARK.strip()} wrong: --k is below the largest class's size"
    return table


def category_record(per_category: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """``{category (as text): {metric: value}}`` for the JSON output."""
    return {str(category): values for category, values in per_category.items()}


@dataclass(frozen=True)
class CategoryCounts:
    """Per category: the queries its metrics average over, and those left out."""

    scored: dict[Any, int]
    left_out: dict[Any, int]

    def as_record(self) -> dict[str, dict[str, int]]:
        """``{"per_category_queries": ..., "per_category_queries_left_out": ...}`` for the
        JSON output, categories as text."""
        return {
            "per_category_queries": {str(name): count for name, count in self.scored.items()},
            "per_category_queries_left_out": {
                str(name): count for name, count in self.left_out.items()
            },
        }


def category_counts(categories: list[Any], scored_rows: Sequence[int]) -> CategoryCounts:
    """Count each category's queries: ``scored_rows`` are the queries the metrics average
    over (``PerQueryValues.query_indices``), the others are left out, as overall.

    Example:
        >>> counts = category_counts(["a", "b", "a"], [0, 1])
        >>> counts.scored, counts.left_out
        ({'a': 1, 'b': 1}, {'a': 1, 'b': 0})
    """
    every = collections.Counter(categories)
    scored = collections.Counter(categories[row] for row in scored_rows)
    names = sorted(every)
    return CategoryCounts(
        {name: scored[name] for name in names}, {name: every[name] - scored[name] for name in names}
    )


def read_image_paths(source: str, num_rows: int, option: str) -> list[Path]:
    """The image of each row: one path per non-empty line, relative to the list's folder."""
    try:
        lines = Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InputFileError(f"{option} '{source}' cannot be read: {error}") from error
    paths = [line.strip() for line in lines if line.strip()]
    if len(paths) != num_rows:
        raise InputFileError(
            f"{option} '{source}' must name one image per embedding row ({num_rows}). "
            f"Got {len(paths)} paths instead."
        )
    folder = Path(source).parent
    return [Path(path) if os.path.isabs(path) else folder / path for path in paths]


def reusable_per_query(calculator: Any, per_query: Any, metric: str) -> PerQueryValues | None:
    """The per-query values of ``evaluate``'s one ``get_accuracy`` call when they are those
    ``find_worst_queries`` would compute for ``metric`` (the metric among them, ``k=None``,
    the inputs' device: the CPU), so the metrics are computed, and warn, once; else None.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.evaluation import AccuracyCalculator
        >>> calculator = AccuracyCalculator(include=("precision_at_1",))
        >>> x, y = torch.tensor([[0.0], [1.0], [5.0], [6.0]]), torch.tensor([0, 0, 1, 1])
        >>> found = calculator.get_accuracy(x, y, return_per_query=True)["per_query"]
        >>> reusable_per_query(calculator, found, "precision_at_1") is found
        True
        >>> reusable_per_query(calculator, found, "recall_at_2") is None
        True
    """
    if not isinstance(per_query, PerQueryValues) or metric not in per_query.values:
        return None
    device = getattr(calculator, "device", None)
    if getattr(calculator, "k", None) is not None or (device is not None and device.type != "cpu"):
        return None
    return per_query


def worst_queries(
    args: argparse.Namespace, inputs: Any, knn_func: Any, per_query: PerQueryValues | None = None
) -> list[WorstQuery]:
    """The ``--show-worst`` queries of what ``evaluate`` read, under the protocol the
    metrics used (groups, single-gallery-shot): the same candidates. ``per_query``: the
    values of the metrics' own call, when :func:`reusable_per_query` found them usable."""
    return find_worst_queries(
        inputs.query,
        inputs.query_labels,
        inputs.reference,
        inputs.reference_labels,
        ref_includes_query=args.ref_includes_query,
        metric=args.worst_metric,
        num_queries=args.show_worst,
        k=args.worst_k,
        knn_func=knn_func,
        per_query=per_query,
        **inputs.protocol(),
    )


def render_worst(worst: list[WorstQuery], metric: str, names: list[Any] | None) -> str:
    """The worst queries as a table: one row per retrieval shown. The value and distance
    columns are named by what the queries carry (their metric; distance or similarity)."""
    if not worst:
        return (
            f"No worst queries by {metric}: every query was left out (none has a relevant "
            "reference to find)"
        )
    header = worst_queries_header(worst)
    rows = []
    for row in worst_queries_rows(worst):
        row[1], row[5] = _named(row[1], names), _named(row[5], names)
        row[2] = f"{row[2]:.4f}"
        row[6] = f"{row[6]:.4f}"
        row[7] = "yes" if row[7] else "no"
        rows.append(row)
    shown = "worst query" if len(worst) == 1 else f"{len(worst)} worst queries"
    title = (
        f"The {shown} by {header[2]}: top retrievals, then the nearest relevant item when "
        "it is further down"
    )
    note = worst_queries_note(worst)
    return title + "\n" + format_table(header, rows) + ("" if note is None else "\n\n" + note)


def worst_record(
    worst: list[WorstQuery], metric: str, names: list[Any] | None, k: int
) -> dict[str, Any]:
    """The worst queries for the JSON output, labels as names when the files had names;
    with the metric, ``k`` and the kind of the distances (``"distance"`` or
    ``"similarity"``) they were found with, and what the values are: ``"value_kind"``
    (``"per_query"``, or under ``--single-gallery-shot`` ``"single_shot_expected"``),
    ``"value_name"`` (the table's column, e.g. ``"recall_at_1 (expected over single-shot
    draws)"``) and ``"rank"`` (what the ranks count)."""
    queries = []
    for item in worst:
        found = item.as_dict()
        found["label"] = _named(found["label"], names)
        for retrieval in [*found["retrievals"], found["nearest_relevant"]]:
            retrieval["label"] = _named(retrieval["label"], names)
        queries.append(found)
    header = worst_queries_header(worst)
    value_kind, draws = worst_queries_value_kind(worst) if worst else (None, None)
    return {
        "metric": queries_metric(worst, None) or metric,
        "k": worst[0].k if worst else k,
        "distance_kind": header[6],
        "value_kind": value_kind,
        "value_name": header[2] if worst else metric,
        "single_shot_draws": draws,
        "rank": header[3],
        "note": worst_queries_note(worst),
        "queries": queries,
    }


def read_worst_images(
    args: argparse.Namespace, inputs: Any
) -> tuple[list[Path], list[Path] | None] | None:
    """The ``--images`` (and ``--reference-images``) lists, read before any work."""
    if getattr(args, "images", None) is None:
        return None
    query_images = read_image_paths(args.images, len(inputs.query), "--images")
    if args.reference_images is None or inputs.reference is None:
        return query_images, None
    reference_images = read_image_paths(
        args.reference_images, len(inputs.reference), "--reference-images"
    )
    return query_images, reference_images


def draw_worst(
    args: argparse.Namespace,
    worst: list[WorstQuery],
    images: tuple[list[Path], list[Path] | None],
    class_names: list[Any] | None,
) -> None:
    """Draw the ``--plot`` picture of the worst queries."""
    path = plot_worst_queries(
        worst,
        args.plot,
        images[0],
        images[1],
        label_names=class_names,
    )
    say_written("Plot", path, to_stderr=args.output == "-")


def _named(label: Any, names: list[Any] | None) -> Any:
    if names is not None and isinstance(label, int) and 0 <= label < len(names):
        return names[label]
    return label
