"""``--junk-labels`` and ``--distractor-labels``: label values given on the command line.

Market-1501's label files mark junk images with -1 (never a candidate) and distractors
with 0 (a candidate that is never relevant); the API takes them as ``junk_labels`` and
``distractor_labels``. On the command line the values are read by the rules of the label
files, so that they mean the labels the files hold: integers for integer labels (``-1``,
``7``, or ``2.0`` as a whole number), the names themselves for labels that are names. A
value of another type than the labels' is refused before any search (it could match
nothing), and so is a value in both lists (a label cannot be both).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from ._errors import UsageError

__all__ = ["check_label_value_options", "encoded_label_values", "label_value_texts"]

OPTIONS = {"junk_labels": "--junk-labels", "distractor_labels": "--distractor-labels"}


def label_value_texts(args: argparse.Namespace, name: str) -> list[str]:
    """The texts given to the option ``name`` (``"junk_labels"``), none when left out."""
    return list(getattr(args, name, None) or [])


def check_label_value_options(args: argparse.Namespace) -> None:
    """No value in both lists (compared as integers where both read as integers, else as
    text): checked before anything is read."""
    junk = {_key(text): text for text in label_value_texts(args, "junk_labels")}
    distractors = {_key(text): text for text in label_value_texts(args, "distractor_labels")}
    both = [junk[key] for key in junk if key in distractors]
    if both:
        raise UsageError(
            f"--junk-labels and --distractor-labels share {', '.join(both)}: a label is "
            "either junk (never a candidate) or a distractor (a candidate never relevant), "
            "not both"
        )


def encoded_label_values(
    args: argparse.Namespace, name: str, names: Sequence[Any] | None
) -> tuple[int, ...]:
    """The option's values as the encoded labels ``get_accuracy`` gets: integers as they
    are for integer label files, else the numbers of the names (``names``: the class
    names, index = number; a value no label has matches nothing and is dropped).

    Raises:
        UsageError: a value that is not a label of the files' type (a name for integer
            labels).
    """
    option = OPTIONS[name]
    values = []
    for text in label_value_texts(args, name):
        if names is None or (names and isinstance(names[0], int)):
            number = _integer(text)
            if number is None:
                raise UsageError(
                    f"{option} takes labels like those of --labels, which are integers; "
                    f"got {text!r}, which is not an integer"
                )
            values.append(number if names is None else _number_of(number, names))
        else:
            values.append(_number_of(text, names))
    return tuple(value for value in values if value is not None)


def _number_of(value: Any, names: Sequence[Any]) -> int | None:
    return names.index(value) if value in names else None


def _integer(text: str) -> int | None:
    """``text`` as an integer by the label files' rules (whole-number floats too)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _key(text: str) -> Any:
    number = _integer(text)
    return text if number is None else number
