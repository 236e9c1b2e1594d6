"""``pml-eval threshold``: choose a verification threshold from scored, labelled pairs."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..evaluation import match_accuracy, match_balanced_accuracy, match_f1
from ..evaluation.verification.operating_points import equal_error_rate, recall_at_false_match_rate
from ..evaluation.verification.thresholds import Metric, select_threshold
from ._output import format_table, say_written, write_results
from ._paths import check_outputs
from ._versions import environment_versions
from .loaders import load_match_labels, load_scores
from .parsers.threshold import TAR_AT_FAR, metric_name

__all__ = ["area_under_roc", "parse_metric", "plot_title", "run"]

logger = logging.getLogger(__name__)

_METRICS: dict[str, Metric] = {
    "f1": match_f1,
    "accuracy": match_accuracy,
    "balanced_accuracy": match_balanced_accuracy,
}


def parse_metric(text: str) -> tuple[str, Metric]:
    """``f1``, ``accuracy``, ``balanced_accuracy`` or ``tar@far=RATE`` -> (name, metric).

    ``RATE`` is a fraction (``0.01``) or a percentage (``1%``).

    Example:
        >>> parse_metric("tar@far=1%")
        ('tar@far=0.01', recall_at_false_match_rate(0.01))
    """
    name = metric_name(text)
    if name.startswith(TAR_AT_FAR):
        return name, recall_at_false_match_rate(float(name[len(TAR_AT_FAR) :]))
    return name, _METRICS[name]


def run(args: argparse.Namespace) -> int:
    """Choose the threshold, print and/or write it, draw the plot if asked; return 0."""
    check_outputs(
        {"--output": args.output, "--plot": args.plot},
        {"SCORES": args.scores, "--labels": args.labels},
    )
    scores = load_scores(args.scores)
    labels = load_match_labels(args.labels, num_rows=len(scores))
    name, metric = parse_metric(args.metric)
    logger.info(
        "Read %d scores (%d should match); metric: %s", len(scores), int(labels.sum()), name
    )
    _warn_if_inverted(scores, labels, args.similarity)
    selection = select_threshold(scores, labels, metric, is_inverted=args.similarity)
    record = {
        "threshold": selection.threshold,
        "value": selection.value,
        "metric": name,
        "is_inverted": bool(args.similarity),
        "num_pairs": len(scores),
        "num_matching": int(labels.sum()),
        "at_threshold": _rates_at(scores, labels, selection.threshold, args.similarity),
        "equal_error_rate": equal_error_rate(scores, labels, is_inverted=args.similarity),
        "scores": args.scores,
        "labels": args.labels,
        "versions": environment_versions(),
        "command": ["pml-eval", *getattr(args, "argv", [])],
    }
    if args.output != "-":
        print(_render(record))
    if args.output:
        write_results(args.output, record)
    if args.plot:
        _plot(args, scores, labels, metric, name, selection.threshold)
    return 0


def area_under_roc(scores: torch.Tensor, labels: torch.Tensor, is_inverted: bool) -> float:
    """The chance that a matching pair is scored more alike than a non-matching one (ties
    count half): 0.5 is chance, below 0.5 the scores separate the pairs the other way.

    Example:
        >>> area_under_roc(torch.tensor([0.1, 0.9]), torch.tensor([True, False]), False)
        1.0
    """
    values = scores.double().numpy()
    alike = -values if is_inverted else values  # smaller = more alike
    _, inverse, counts = np.unique(alike, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # 1-based, ties averaged
    matches = labels.numpy().astype(bool)
    positives, negatives = int(matches.sum()), int((~matches).sum())
    # Mann-Whitney: matches ranked before non-matches
    below = ranks[matches].sum() - positives * (positives + 1) / 2.0
    return float(1.0 - below / (positives * negatives))


def _warn_if_inverted(scores: torch.Tensor, labels: torch.Tensor, is_inverted: bool) -> None:
    """Say so when the scores separate the pairs the other way round from what was said."""
    if bool(labels.all()) or not bool(labels.any()):
        return
    auc = area_under_roc(scores, labels, is_inverted)
    if auc >= 0.5:
        return
    if is_inverted:
        told, hint = "similarities", "if they are distances, drop --similarity"
    else:
        told, hint = "distances", "if they are similarities, rerun with --similarity"
    print(
        f"pml-eval: warning: the scores look inverted: read as {told}, matching pairs score "
        f"less alike than non-matching ones (area under the ROC curve {auc:.4f}, below the "
        f"0.5 of chance); {hint}.",
        file=sys.stderr,
    )


def _rates_at(
    scores: torch.Tensor, labels: torch.Tensor, threshold: float, is_inverted: bool
) -> dict[str, float]:
    """The decisions at ``threshold`` (the MatchFinder rule), summarized."""
    decided = scores >= threshold if is_inverted else scores <= threshold
    tp = int((decided & labels).sum())
    fp = int((decided & ~labels).sum())
    fn = int((~decided & labels).sum())
    tn = int((~decided & ~labels).sum())
    return {
        "true_positives": tp,
        "false_positives": fp,
        "true_negatives": tn,
        "false_negatives": fn,
        "true_match_rate": tp / (tp + fn),
        "false_match_rate": fp / (fp + tn),
        "accuracy": (tp + tn) / len(scores),
    }


def _render(record: dict[str, Any]) -> str:
    kind = "similarities" if record["is_inverted"] else "distances"
    rule = ">=" if record["is_inverted"] else "<="
    rates = record["at_threshold"]
    rows = [
        ["threshold", record["threshold"]],
        [record["metric"], record["value"]],
        ["true match rate", rates["true_match_rate"]],
        ["false match rate", rates["false_match_rate"]],
        ["accuracy", rates["accuracy"]],
        ["equal error rate", record["equal_error_rate"]],
    ]
    header = (
        f"{record['scores']}: {record['num_pairs']} pairs ({record['num_matching']} should "
        f"match) scored by {kind}; a pair matches when its score is {rule} the threshold.\n"
    )
    return header + "\n" + format_table(["", "value"], rows)


def plot_title(scores: str, num_pairs: int, num_matching: int, is_similarity: bool) -> str:
    """What the plotted scores are, as the demo's "Validation pairs (cosine similarity)".

    Example:
        >>> plot_title("val_pairs.npz", 10, 4, is_similarity=True)
        '10 pairs of val_pairs.npz, 4 should match (scores: similarities, larger = more alike)'
    """
    kind = "similarities, larger" if is_similarity else "distances, smaller"
    return (
        f"{num_pairs} pairs of {Path(scores).name}, {num_matching} should match "
        f"(scores: {kind} = more alike)"
    )


def _plot(
    args: argparse.Namespace,
    scores: torch.Tensor,
    labels: torch.Tensor,
    metric: Metric,
    name: str,
    threshold: float,
) -> None:
    from ..plots import plot_verification

    path = plot_verification(
        scores,
        labels,
        args.plot,
        is_inverted=args.similarity,
        metric=metric,
        metric_name=name,
        threshold=threshold,
        title=plot_title(args.scores, len(scores), int(labels.sum()), args.similarity),
    )
    say_written("Plot", path, to_stderr=args.output == "-")
