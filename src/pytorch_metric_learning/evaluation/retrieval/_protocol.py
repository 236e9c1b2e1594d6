"""The retrieval protocols of re-identification benchmarks, as rules for the search.

Market-1501, DukeMTMC-reID and MSMT17 give each image a camera id (a *group*). For a query,
a gallery image of its identity taken by its camera is not a candidate (it would be too
easy a match); gallery images whose label is a *junk* label (Market-1501: -1) are no
query's candidate; images whose label is a *distractor* label (Market-1501: 0, "0000")
are candidates that are never relevant. A set may also play both roles (``is_query`` and
``is_reference`` flags, as Open Metric Learning's datasets have them): an item is never its
own candidate. Users may add an explicit list of (query, reference) pairs.

All of it becomes one :class:`~..search.exclusion.Exclusion` (rules, no dense mask) and a
per-query count ``R`` of the *valid relevant* references (relevant, a candidate, not a
distractor), which the metrics use in place of the label counts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from ..._validation import invalid
from ..._warnings import warn_external
from ...errors import InvalidArgumentError, InvalidTypeError
from ..search.exclusion import Exclusion, key_pairs
from ._label_stats import LabelStats

__all__ = [
    "ProtocolOptions",
    "Roles",
    "Protocol",
    "build_protocol",
    "check_groups",
    "check_pairs",
    "group_ids",
    "split_roles",
]

logger = logging.getLogger(__name__)
CALLER = "AccuracyCalculator.get_accuracy"


@dataclass(frozen=True)
class ProtocolOptions:
    """What ``get_accuracy`` was told about groups, junk, distractors and pairs."""

    query_groups: torch.Tensor | None = None
    reference_groups: torch.Tensor | None = None
    junk_labels: tuple[Any, ...] = ()
    distractor_labels: tuple[Any, ...] = ()
    excluded_pairs: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        query_groups: Any,
        reference_groups: Any,
        junk_labels: Sequence[Any] | None,
        distractor_labels: Sequence[Any] | None,
        excluded_pairs: Any,
    ) -> ProtocolOptions:
        """The options of one ``get_accuracy`` call, junk and distractor labels checked."""
        return cls(
            query_groups,
            reference_groups,
            label_tuple(junk_labels, "junk_labels"),
            label_tuple(distractor_labels, "distractor_labels"),
            excluded_pairs,
        )

    def given(self) -> list[str]:
        """The names of the options given (for a refusal to name them)."""
        names = (
            "query_groups",
            "reference_groups",
            "junk_labels",
            "distractor_labels",
            "excluded_pairs",
        )
        return [name for name in names if _given(getattr(self, name))]

    @property
    def active(self) -> bool:
        return (
            self.query_groups is not None
            or self.reference_groups is not None
            or bool(self.junk_labels)
            or bool(self.distractor_labels)
            or self.excluded_pairs is not None
        )


def _given(value: Any) -> bool:
    """Whether an option was given: not None, and not an empty tuple of labels (arrays and
    tensors are never compared, only tested for None)."""
    return value is not None and not (isinstance(value, tuple) and len(value) == 0)


@dataclass(frozen=True)
class Roles:
    """Which rows of one set are queries and which are references."""

    query_rows: torch.Tensor
    reference_rows: torch.Tensor


@dataclass(frozen=True)
class Protocol:
    """The rules of one call: the exclusion and the references that are never relevant."""

    exclusion: Exclusion
    distractors: torch.Tensor | None


def split_roles(is_query: Any, is_reference: Any, length: int) -> Roles:
    """Check the two flag vectors of one set and return the rows of each role."""
    flags = []
    for param, value in (("is_query", is_query), ("is_reference", is_reference)):
        if value is None:
            raise invalid(
                param, CALLER, f"a bool tensor with one flag per embedding ({length})", None
            )
        value = torch.as_tensor(value) if not isinstance(value, torch.Tensor) else value
        if value.dtype != torch.bool or value.shape != (length,):
            raise invalid(
                param,
                CALLER,
                f"a bool tensor with one flag per embedding ({length})",
                f"{value.dtype} of shape {tuple(value.shape)}",
            )
        flags.append(value)
    for param, value in zip(("is_query", "is_reference"), flags):
        if not bool(value.any()):
            raise invalid(param, CALLER, "at least one True flag", "none")
    return Roles(flags[0].nonzero().flatten(), flags[1].nonzero().flatten())


def check_groups(values: Any, param: str, length: int, device: torch.device) -> torch.Tensor:
    """One integer group id per row (a camera id), as a long tensor on ``device``."""
    expected = f"a 1-D integer tensor with one group id per row ({length})"
    values = group_ids(values, param, CALLER, expected)
    if values.shape != (length,):
        raise invalid(param, CALLER, expected, f"{values.dtype} of shape {tuple(values.shape)}")
    return values.to(device)


def group_ids(values: Any, param: str, caller: str, expected: str) -> torch.Tensor:
    """``values`` as a 1-D long tensor of integer group ids, or a named error.

    The one check of group ids for ``get_accuracy`` and the testers' ``split_groups``:
    strings (e.g. camera names), floats, bools and nested values are refused by name.
    """
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):
            raise invalid(param, caller, expected, _kind_of(values), InvalidTypeError) from None
    if (
        values.ndim != 1
        or values.is_floating_point()
        or values.is_complex()
        or (values.dtype == torch.bool)
    ):
        raise invalid(param, caller, expected, f"{values.dtype} of shape {tuple(values.shape)}")
    return values.long()


def _kind_of(values: Any) -> str:
    """A short description of what was given: the type, and the first item's type."""
    try:
        first = next(iter(values))
    except (TypeError, StopIteration):
        return type(values).__name__
    return f"{type(values).__name__} of {type(first).__name__}"


def check_pairs(pairs: Any, sizes: tuple[int, int], device: torch.device) -> torch.Tensor | None:
    """``excluded_pairs`` as an ``(m, 2)`` long tensor of in-range (query, reference) rows.

    A tensor, a numpy array or a (possibly empty) list of pairs is accepted; bools are
    refused (a mask is not a list of pairs), as are floats and out-of-range indices, all
    by the name ``excluded_pairs``. ``sizes`` is ``(num_query, num_reference)``.
    """
    if pairs is None:
        return None
    expected = "an (m, 2) integer tensor of (query row, reference row) pairs"
    if isinstance(pairs, (torch.Tensor, np.ndarray)) and pairs.dtype in (torch.bool, np.bool_):
        raise invalid(
            "excluded_pairs", CALLER, expected, f"a bool {type(pairs).__name__}", InvalidTypeError
        )
    if not isinstance(pairs, torch.Tensor):
        if not isinstance(pairs, (np.ndarray, Sequence)) or isinstance(pairs, (str, bytes)):
            raise invalid(
                "excluded_pairs", CALLER, expected, type(pairs).__name__, InvalidTypeError
            )
        try:
            pairs = torch.as_tensor(pairs) if len(pairs) else torch.zeros(0, 2, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError):
            raise invalid(
                "excluded_pairs", CALLER, expected, _kind_of(pairs), InvalidTypeError
            ) from None
    if pairs.dtype == torch.bool:
        raise invalid("excluded_pairs", CALLER, expected, "a bool tensor", InvalidTypeError)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.is_floating_point() or pairs.is_complex():
        raise invalid(
            "excluded_pairs", CALLER, expected, f"{pairs.dtype} of shape {tuple(pairs.shape)}"
        )
    pairs = pairs.to(device).long()
    for column, size, role in ((0, sizes[0], "query"), (1, sizes[1], "reference")):
        values = pairs[:, column]
        if len(values) and (int(values.min()) < 0 or int(values.max()) >= size):
            raise invalid(
                "excluded_pairs",
                CALLER,
                f"{role} row indices in [0, {size})",
                f"indices from {int(values.min())} to {int(values.max())}",
            )
    return pairs


def build_protocol(
    options: ProtocolOptions,
    stats: LabelStats,
    labels: tuple[torch.Tensor, torch.Tensor],
    self_rows: torch.Tensor | None,
) -> Protocol:
    """The exclusion and distractors of one call.

    ``labels`` is ``(query_labels, reference_labels)``; ``self_rows[q]`` is the reference
    row that is query ``q`` itself (-1 for none), or None when no query is a reference.
    """
    query_labels, reference_labels = labels
    num_query, num_reference = len(query_labels), len(reference_labels)
    rules: list[tuple[torch.Tensor, torch.Tensor]] = []
    if options.query_groups is not None and options.reference_groups is not None:
        assert stats.query_keys is not None and stats.reference_keys is not None
        _warn_if_no_shared_group(options.query_groups, options.reference_groups)
        rules.append(
            key_pairs(
                torch.cat([stats.query_keys, stats.reference_keys]),
                torch.cat([options.query_groups, options.reference_groups]),
                num_reference,
            )
        )
    if self_rows is not None:
        rules.append((self_rows, torch.arange(num_reference, device=self_rows.device)))
    exclusion = Exclusion(
        num_query,
        num_reference,
        same_keys=rules,
        pairs=options.excluded_pairs,
        never_candidates=_labelled(reference_labels, options.junk_labels, "junk_labels"),
    )
    distractors = _labelled(reference_labels, options.distractor_labels, "distractor_labels")
    return Protocol(exclusion, distractors if bool(distractors.any()) else None)


def _warn_if_no_shared_group(query_groups: torch.Tensor, reference_groups: torch.Tensor) -> None:
    """Groups that never meet exclude nothing: most likely ids numbered apart (camera
    ``1`` in one file, ``"c1"`` in the other), so say so rather than stay silent."""
    meet = torch.isin(query_groups, reference_groups).any()
    if len(query_groups) and len(reference_groups) and not bool(meet):
        warn_external(
            "No query group occurs among the reference groups ('query_groups' and "
            "'reference_groups' of AccuracyCalculator.get_accuracy), so the same-group "
            "rule excludes nothing; check that both number the groups alike."
        )


def protocol_stats(stats: LabelStats, protocol: Protocol) -> LabelStats:
    """``stats`` with ``R`` counting only the valid relevant references of each query."""
    assert stats.query_keys is not None and stats.reference_keys is not None
    counted = torch.ones_like(stats.reference_keys, dtype=torch.bool)
    never = protocol.exclusion.never_candidates
    if never is not None:
        counted &= ~never
    if protocol.distractors is not None:
        counted &= ~protocol.distractors
    size = int(max(stats.query_keys.max(), stats.reference_keys.max())) + 1
    counts = torch.bincount(stats.reference_keys[counted], minlength=size)
    num_relevant = counts[stats.query_keys].clone()
    for rows, columns in protocol.exclusion.distinct_pairs():
        lost = counted[columns] & (stats.reference_keys[columns] == stats.query_keys[rows])
        num_relevant -= torch.bincount(rows[lost], minlength=len(num_relevant))
    left_out = int((num_relevant == 0).sum())
    if left_out:
        logger.info(
            "%d of %d queries have no valid relevant reference (after the protocol's "
            "exclusions) and are left out of the k-NN metrics.",
            left_out,
            len(num_relevant),
        )
    return replace(stats, num_relevant=num_relevant)


def protocol_relevance(
    relevance: torch.Tensor, indices: torch.Tensor, valid: torch.Tensor, protocol: Protocol
) -> torch.Tensor:
    """Relevant only where the neighbour is a candidate and not a distractor."""
    relevance = relevance & valid
    if protocol.distractors is not None:
        relevance &= ~protocol.distractors[indices]
    return relevance


def check_no_overlap(options: ProtocolOptions) -> None:
    """Junk and distractor labels must differ (a label cannot be both)."""
    both = set(options.junk_labels) & set(options.distractor_labels)
    if both:
        raise InvalidArgumentError(
            "The 'junk_labels' and 'distractor_labels' parameters of "
            f"{CALLER} must not share labels. Got {sorted(both)} in both instead."
        )


def label_tuple(values: Any, param: str) -> tuple[int | float, ...]:
    """The junk or distractor labels as a tuple of Python numbers.

    A list, tuple, torch tensor or numpy array of numbers is accepted alike (1-D, or a
    single number as a 0-D tensor/array); anything else is refused by name.
    """
    if values is None:
        return ()
    if isinstance(values, (torch.Tensor, np.ndarray)):
        if values.dtype in (torch.bool, np.bool_) or values.ndim > 1:
            raise invalid(
                param, CALLER, "a 1-D sequence of numeric labels", values, InvalidTypeError
            )
        listed = values.tolist()
        items = listed if isinstance(listed, list) else [listed]
    elif isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise invalid(param, CALLER, "a sequence of labels", values, InvalidTypeError)
    else:
        items = list(values)
    numbers: list[int | float] = []
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, Real):
            raise invalid(param, CALLER, "a sequence of numeric labels", values, InvalidTypeError)
        numbers.append(int(item) if isinstance(item, Integral) else float(item))
    return tuple(numbers)


def _labelled(labels: torch.Tensor, chosen: tuple[Any, ...], param: str) -> torch.Tensor:
    """Whether each 1-D label is exactly one of ``chosen``.

    Labels are compared exactly: a chosen value that no label of this dtype can equal
    (1.5 against integer labels, 257 against uint8 labels, 2**64 against int64 labels)
    is no label in the data, so it matches nothing (as a missing integer label does);
    it is never truncated or wrapped onto a real label.
    """
    if not chosen:
        return torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    if labels.ndim != 1:
        raise invalid(
            param, CALLER, "to be used with 1-D labels", f"labels of shape {tuple(labels.shape)}"
        )
    representable = [value for value in chosen if _fits(value, labels.dtype)]
    if not representable:
        return torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    return torch.isin(labels, torch.tensor(representable, dtype=labels.dtype, device=labels.device))


def _fits(value: int | float, dtype: torch.dtype) -> bool:
    """Whether some label of ``dtype`` equals ``value`` (integers: exactly, in range)."""
    if dtype == torch.bool:
        return value in (0, 1)
    if not dtype.is_floating_point and not dtype.is_complex:
        if isinstance(value, float) and not value.is_integer():
            return False
        info = torch.iinfo(dtype)
        return info.min <= value <= info.max
    # Float labels: the value rounds to the dtype as ``labels == value`` would round it,
    # but a finite value that overflows to infinity equals no finite label.
    try:
        converted = torch.tensor(float(value), dtype=dtype).item()
    except (OverflowError, RuntimeError):
        return False
    return math.isfinite(converted) or not math.isfinite(value)
