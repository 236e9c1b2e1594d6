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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ..search.exclusion import Exclusion, key_pairs
from ._label_stats import LabelStats

__all__ = ["ProtocolOptions", "Roles", "Protocol", "build_protocol", "split_roles"]

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

    @property
    def active(self) -> bool:
        return (
            self.query_groups is not None
            or self.reference_groups is not None
            or bool(self.junk_labels)
            or bool(self.distractor_labels)
            or self.excluded_pairs is not None
        )


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
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):
            raise invalid(
                param,
                CALLER,
                "a 1-D tensor of integer group ids",
                type(values).__name__,
                InvalidTypeError,
            ) from None
    if values.shape != (length,) or values.is_floating_point() or values.dtype == torch.bool:
        raise invalid(
            param,
            CALLER,
            f"a 1-D integer tensor with one group id per row ({length})",
            f"{values.dtype} of shape {tuple(values.shape)}",
        )
    return values.to(device).long()


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


def label_tuple(values: Sequence[Any] | None, param: str) -> tuple[Any, ...]:
    """The junk or distractor labels as a tuple of Python numbers."""
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise invalid(param, CALLER, "a sequence of labels", values, InvalidTypeError)
    items = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise invalid(param, CALLER, "a sequence of numeric labels", values, InvalidTypeError)
    return tuple(items)


def _labelled(labels: torch.Tensor, chosen: tuple[Any, ...], param: str) -> torch.Tensor:
    """Whether each 1-D label is one of ``chosen``."""
    if not chosen:
        return torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    if labels.ndim != 1:
        raise invalid(
            param, CALLER, "to be used with 1-D labels", f"labels of shape {tuple(labels.shape)}"
        )
    return torch.isin(labels, torch.tensor(chosen, dtype=labels.dtype, device=labels.device))
