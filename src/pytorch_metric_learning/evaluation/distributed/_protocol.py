"""The re-identification protocol of AccuracyCalculator for sharded query and reference.

Each rank holds its rows' labels and groups (camera ids). The exclusion becomes a
:class:`ShardExclusion`: key rows ``(query class, group)`` travel with the query rows,
junk labels flag the local reference rows, and explicit pairs are global row numbers.
``R`` (the valid relevant references of each query) is reduced from per-class counts and
a table of distinct ``(class, group)`` rows, so no rank holds the other ranks' rows; only
explicit pairs need every query's class and group (one row per query, gathered).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._validation import invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ..retrieval._protocol import (
    ProtocolOptions,
    check_groups,
    check_no_overlap,
)
from ._collectives import Comm, agree, all_gather_ints, all_gather_rows, all_reduce_sum
from ._labels import counts_of, global_label_counts
from .exclusion import ShardExclusion, check_pair_range, gather_pairs, local_pairs

__all__ = ["ShardProtocol", "check_protocol_options", "shard_protocol"]

_CALLER = "DistributedAccuracyCalculator.get_accuracy"


@dataclass
class ShardProtocol:
    """One rank's exclusion, distractor labels and ``R`` of its queries."""

    exclusion: ShardExclusion
    distractors: torch.Tensor  # the distractor labels (1-D, the labels' dtype)
    num_relevant: torch.Tensor

    def relevance(
        self, equal: torch.Tensor, indices: torch.Tensor, knn_labels: torch.Tensor
    ) -> torch.Tensor:
        """Relevant only for candidates (index >= 0) that are not distractors."""
        relevant = equal & (indices >= 0)
        if len(self.distractors):
            relevant &= ~torch.isin(knn_labels, self.distractors)
        return relevant


def check_protocol_options(
    query_groups: Any,
    reference_groups: Any,
    junk_labels: Sequence[Any],
    distractor_labels: Sequence[Any],
    excluded_pairs: Any,
) -> ProtocolOptions:
    """The options as AccuracyCalculator holds them (checks that need no other rank)."""
    options = ProtocolOptions.of(
        query_groups, reference_groups, junk_labels, distractor_labels, excluded_pairs
    )
    check_no_overlap(options)
    if excluded_pairs is not None and not isinstance(excluded_pairs, torch.Tensor):
        raise invalid(
            "excluded_pairs", _CALLER, "an (m, 2) integer tensor of global row numbers",
            type(excluded_pairs).__name__, InvalidTypeError,
        )  # fmt: skip
    return options


def shard_protocol(
    comm: Comm, shards: Any, options: ProtocolOptions, one_set: bool
) -> ShardProtocol:
    """This rank's protocol; every rank must call it (it agrees and reduces)."""
    error, meta = None, [0, 0, 0]
    groups: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    try:
        groups = _local_groups(shards, options, one_set)
        meta = [int(groups[0] is not None), len(options.junk_labels),
                len(options.distractor_labels)]  # fmt: skip
    except Exception as exc:
        error = exc
    table = agree(comm, error, f"checking the protocol options of {_CALLER}", meta)
    _check_alike(comm, table, options)
    device = shards.query.device
    junk = _isin(shards.reference_labels, options.junk_labels)
    counted = ~junk & ~_isin(shards.reference_labels, options.distractor_labels)
    reference_class = _class_of(shards.query_classes, shards.reference_labels)
    query_groups, reference_groups = groups
    num_relevant = _label_counts(comm, shards, reference_class, counted)
    query_keys = reference_keys = None
    if query_groups is not None and reference_groups is not None:
        query_keys = torch.stack([shards.query_class, query_groups], dim=1)
        reference_keys = torch.stack([reference_class, reference_groups], dim=1)
        num_relevant -= _key_counts(comm, query_keys, reference_keys, counted)
    elif shards.ref_includes_query:
        num_relevant -= counted[: len(shards.query)].long()
    if bool(all_gather_ints(comm, [int(options.excluded_pairs is not None)], "pairs")[:, 0].any()):
        lost = _pairs_lost(comm, shards, options.excluded_pairs, query_keys, reference_keys,
                           (reference_class, counted))  # fmt: skip
        num_relevant -= lost
    distractors = torch.tensor(
        options.distractor_labels, dtype=shards.reference_labels.dtype, device=device
    )
    exclusion = ShardExclusion(query_keys, reference_keys, options.excluded_pairs, junk)
    return ShardProtocol(exclusion, distractors, num_relevant)


def _local_groups(
    shards: Any, options: ProtocolOptions, one_set: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """This rank's checked group ids of its query and reference rows (or None)."""
    if shards.query_labels.ndim != 1:
        raise invalid(
            "query_labels", _CALLER, "1-D labels with the protocol options",
            f"labels of shape {tuple(shards.query_labels.shape)}",
        )  # fmt: skip
    query_groups, reference_groups = options.query_groups, options.reference_groups
    if one_set:
        if reference_groups is not None:
            raise InvalidArgumentError(
                f"The 'reference_groups' parameter of {_CALLER} must be None when the query "
                "is its own reference ('query_groups' covers both)."
            )
        reference_groups = query_groups
    elif (query_groups is None) != (reference_groups is None):
        missing = "reference_groups" if reference_groups is None else "query_groups"
        raise invalid(missing, _CALLER, "group ids (both or neither)", None)
    if query_groups is None:
        return None, None
    device = shards.query.device
    query_groups = check_groups(query_groups, "query_groups", len(shards.query), device)
    reference_groups = check_groups(
        reference_groups, "reference_groups", len(shards.reference), device
    )
    return query_groups, reference_groups


def _check_alike(comm: Comm, table: torch.Tensor, options: ProtocolOptions) -> None:
    """Groups given on every rank or none, and the same junk and distractor labels."""
    if len(set(table[:, 0].tolist())) > 1:
        raise InvalidArgumentError(
            f"The group ids of {_CALLER} must be given on every rank or on none. Got them on "
            f"ranks {table[:, 0].nonzero().flatten().tolist()} only."
        )
    for column, name in ((1, "junk_labels"), (2, "distractor_labels")):
        values = getattr(options, name)
        sizes = table[:, column].tolist()
        mine = torch.tensor(sorted(values), dtype=torch.float64).reshape(-1)
        every = all_gather_rows(comm, mine, sizes, f"comparing the {name}").cpu()
        parts = torch.split(every, sizes)
        if len(set(sizes)) > 1 or any(not torch.equal(part, parts[0]) for part in parts):
            raise InvalidArgumentError(
                f"The '{name}' parameter of {_CALLER} must be the same on every rank. "
                f"Got {[part.tolist() for part in parts]} (by rank) instead."
            )


def _isin(labels: torch.Tensor, chosen: tuple[Any, ...]) -> torch.Tensor:
    if not chosen:
        return torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    return torch.isin(labels, torch.tensor(chosen, dtype=labels.dtype, device=labels.device))


def _class_of(classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each label's index in the sorted global query classes, -1 where it is none."""
    if len(classes) == 0:
        return torch.full((len(labels),), -1, dtype=torch.long, device=labels.device)
    place = torch.searchsorted(classes, labels.contiguous()).clamp_max(len(classes) - 1)
    return torch.where(classes[place] == labels, place, -1)


def _label_counts(
    comm: Comm, shards: Any, reference_class: torch.Tensor, counted: torch.Tensor
) -> torch.Tensor:
    """Counted references of every rank with each local query's label."""
    kept = reference_class[counted & (reference_class >= 0)]
    counts = torch.bincount(kept, minlength=len(shards.query_classes))
    counts = all_reduce_sum(comm, counts, "counting the valid relevant references")
    return counts.to(shards.query_class.device)[shards.query_class]


def _key_counts(
    comm: Comm, query_keys: torch.Tensor, reference_keys: torch.Tensor, counted: torch.Tensor
) -> torch.Tensor:
    """Counted references of every rank with each local query's (class, group) row."""
    rows = reference_keys[counted & (reference_keys[:, 0] >= 0)]
    unique, counts = global_label_counts(comm, rows, "counting the same-group references")
    return counts_of(unique, counts, query_keys)


def _pairs_lost(
    comm: Comm,
    shards: Any,
    pairs: torch.Tensor | None,
    query_keys: torch.Tensor | None,
    reference_keys: torch.Tensor | None,
    reference_facts: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Valid relevant references each local query loses to the explicit pairs alone.

    Each pair is judged where its reference lives, from every query's (class, group) row
    gathered once; pairs the group rule or the self match already exclude are not
    counted twice."""
    layout, device = shards.layout, shards.query.device
    reference_class, counted = reference_facts
    every = gather_pairs(comm, pairs, device)
    check_pair_range(every, layout.num_query, layout.num_reference)
    ids = layout.reference_ids(comm.rank, device)
    mine = local_pairs(every, ids)
    queries, columns = mine[:, 0], mine[:, 1]
    rows = query_keys if query_keys is not None else shards.query_class.unsqueeze(1)
    all_rows = all_gather_rows(comm, rows, list(layout.query_counts), "sharing the query keys")
    all_rows = all_rows.to(device)[queries]
    lost = counted[columns] & (reference_class[columns] == all_rows[:, 0])
    if reference_keys is not None:
        lost &= reference_keys[columns, 1] != all_rows[:, 1]
    if shards.ref_includes_query:
        lost &= ids[columns] != queries
    per_query = torch.bincount(queries[lost], minlength=layout.num_query)
    per_query = all_reduce_sum(comm, per_query, "counting the pairs' lost references").to(device)
    start = layout.query_offset(comm.rank)
    return per_query[start : start + len(shards.query)]
