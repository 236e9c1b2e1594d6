"""Turn a tester's ``splits_to_eval`` argument into a checked evaluation plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._validation import invalid
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["SplitPlan", "resolve_splits_to_eval", "splits_to_embed"]

# One evaluation: a query split and its reference splits, the query first when present.
SplitPlan = list[tuple[str, tuple[str, ...]]]


def resolve_splits_to_eval(
    splits_to_eval: Sequence[tuple[str, Sequence[str]]] | None,
    dataset_dict: Mapping[str, Any],
    owner: str,
) -> SplitPlan:
    """Check ``splits_to_eval`` against ``dataset_dict`` and return a new plan.

    ``None`` makes every split query itself, in the order of ``dataset_dict``. A query
    split may appear once; a reference list may not repeat a split; every name must be a
    key of ``dataset_dict``. When the query split is among its references it is moved to
    the front, so that the first rows of the reference are the query. The caller's list
    is never modified.
    """
    if splits_to_eval is None:
        return [(name, (name,)) for name in dataset_dict]
    if isinstance(splits_to_eval, (str, bytes)) or not isinstance(splits_to_eval, Sequence):
        raise invalid(
            "splits_to_eval",
            owner,
            "a list of (query_split, [reference_splits]) pairs",
            splits_to_eval,
            InvalidTypeError,
        )
    plan: SplitPlan = []
    for entry in splits_to_eval:
        query, references = _check_entry(entry, dataset_dict, owner)
        if any(query == seen for seen, _ in plan):
            raise InvalidArgumentError(
                f"The 'splits_to_eval' parameter of {owner} may list the query split "
                f"{query!r} only once. Got it more than once in {splits_to_eval!r}."
            )
        plan.append((query, _query_first(query, references)))
    return plan


def splits_to_embed(plan: SplitPlan) -> list[str]:
    """Every split that is a query or a reference, once each, in order of first use."""
    names: dict[str, None] = {}
    for query, references in plan:
        names[query] = None
        names.update(dict.fromkeys(references))
    return list(names)


def _check_entry(entry: Any, dataset_dict: Mapping[str, Any], owner: str) -> tuple[str, list[str]]:
    expected = "a list of (query_split, [reference_splits]) pairs"
    if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
        raise invalid("splits_to_eval", owner, expected, entry, InvalidTypeError)
    query, references = entry
    if isinstance(references, (str, bytes)) or not isinstance(references, Sequence):
        raise invalid(
            "splits_to_eval",
            owner,
            f"{expected}, whose reference splits are a list such as [{references!r}]",
            entry,
            InvalidTypeError,
        )
    references = list(references)
    if not references:
        raise invalid("splits_to_eval", owner, f"{expected} with at least one reference", entry)
    if len(set(references)) != len(references):
        raise invalid("splits_to_eval", owner, f"{expected} without duplicate references", entry)
    for name in [query, *references]:
        if name not in dataset_dict:
            raise InvalidArgumentError(
                f"The 'splits_to_eval' parameter of {owner} names the split {name!r}, which "
                f"is not in dataset_dict. Got {entry!r}; the splits are {list(dataset_dict)}."
            )
    return query, references


def _query_first(query: str, references: list[str]) -> tuple[str, ...]:
    if query not in references:
        return tuple(references)
    return (query, *[name for name in references if name != query])
