"""The names of the retrieval metrics, without torch: the command line checks them early.

``pml-eval evaluate --metrics`` and ``--help`` answer before torch is imported, so the
names live here, in a module that imports nothing heavy;
:mod:`pytorch_metric_learning.evaluation.retrieval` builds its metrics on these names.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_METRICS",
    "ON_REQUEST_METRICS",
    "FAMILIES",
    "parametrized_parts",
    "describe_families",
    "zero_one_by_definition",
]

# Computed by AccuracyCalculator when include=() ...
DEFAULT_METRICS = (
    "AMI",
    "NMI",
    "mean_average_precision_at_r",
    "precision_at_1",
    "r_precision",
)
# ... and these only when asked for.
ON_REQUEST_METRICS = (
    "mean_average_precision",
    "mean_reciprocal_rank",
    "mean_inverse_negative_penalty",
)

# The parametrized families, as they are written in messages and docs.
FAMILIES = (
    "recall_at_<K>",
    "precision_at_<K>",
    "mean_average_precision_at_<K>",
    "ndcg_at_<K>",
)
_PATTERN = re.compile(r"(recall|precision|mean_average_precision|ndcg)_at_([1-9][0-9]*)")


def parametrized_parts(name: object) -> tuple[str, int] | None:
    """The family and cutoff of a name such as ``recall_at_8``, ``None`` for any other.

    Example:
        >>> parametrized_parts("recall_at_8")
        ('recall', 8)
        >>> parametrized_parts("mean_average_precision_at_r") is None
        True
    """
    match = _PATTERN.fullmatch(name) if isinstance(name, str) else None
    return None if match is None else (match.group(1), int(match.group(2)))


def describe_families() -> str:
    """The families for error messages and help texts.

    Example:
        >>> describe_families()
        'recall_at_<K>, precision_at_<K>, mean_average_precision_at_<K>, ndcg_at_<K> (K >= 1)'
    """
    return ", ".join(FAMILIES) + " (K >= 1)"


def zero_one_by_definition(name: object) -> bool:
    """Whether a metric's per-query value is a 0/1 outcome by its definition
    (``recall_at_<K>``, ``precision_at_1``), not merely on some data: an interval for a
    binomial proportion fits only these (``mean_average_precision`` is 0/1 on an easy
    test set, but a proportion it is not).

    Example:
        >>> [zero_one_by_definition(n) for n in ("recall_at_4", "precision_at_1", "r_precision")]
        [True, True, False]
    """
    parts = parametrized_parts(name)
    return parts is not None and (parts[0] == "recall" or parts == ("precision", 1))
