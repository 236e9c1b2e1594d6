"""Exact k-NN over a reference sharded across the ranks of a ``torch.distributed`` group."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, NamedTuple

import torch

from ..._validation import check_positive_int, check_tensor, invalid
from ...errors import BackendRuntimeError, InvalidArgumentError
from ..search._excluded_search import search_excluding
from ..search._rescale import Rescaled, largest_magnitude, rescale
from ..search.exclusion import Exclusion
from ..search.knn import check_search_inputs
from ..search.protocols import KNNFunc, knn_is_inverted
from ..search.registry import load_knn_func
from ._collectives import (
    Comm,
    agree,
    all_gather_rows,
    all_reduce_max,
    all_to_all_rows,
    resolve_comm,
    resolve_timeout,
)
from ._layout import ShardLayout
from .exclusion import (
    ShardExclusion,
    ShardRule,
    as_rows,
    check_pair_range,
    gather_pairs,
    local_pairs,
)

__all__ = ["DistributedKNN", "merge_order", "merge_top_k"]

_OWNER = "DistributedKNN"
# Dtypes a query or a distance may have, by code, for exchanging them as ints.
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Dtypes reference labels may have (they travel with the results).
_LABEL_DTYPES = (
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.float64,
    torch.float32,
)
# Global index of a padding candidate: sorts after every real row.
_NO_INDEX = torch.iinfo(torch.long).max


class DistributedKNN:
    """Exact k-NN where every rank holds a shard of the query and of the reference.

    Every rank of the group calls the backend with its own shards and gets the neighbours of
    its own query rows among the whole (global) reference. Query rows travel in blocks: in
    each step every rank contributes up to ``block_size`` rows, each rank searches the
    gathered block in its reference shard with a local exact backend, and each query's
    owner merges the partial top-k lists. Per rank, memory beyond the inputs and outputs is
    one gathered block (``world_size * block_size`` rows) and its partial results.

    Indices address the global reference: the reference shards concatenated in rank order
    (rank 0's rows first). With ``ref_includes_query=True`` each rank's query shard must be
    the first rows of its reference shard, and the global reference is the global query
    (query shards in rank order) followed by the other reference rows of every rank in rank
    order. This is the single-process contract on the concatenated data: the global query
    is the first rows of the global reference, and query row ``i`` leaves out reference row
    ``i``. Ties are ordered by distance, then global index.

    An ``exclusion`` (a :class:`ShardExclusion` per rank) leaves pairs out inside each
    rank's search of a gathered query block against its reference shard: the query rows'
    keys travel with the block, and the local backend searches with a local
    :class:`~pytorch_metric_learning.evaluation.search.exclusion.Exclusion` (CustomKNN
    applies it tile by tile). A row with fewer than ``k`` candidates gets index ``-1``
    (and the worst distance) in its last columns.

    Args:
        knn_func: The local exact backend, as a spec for
            :func:`~pytorch_metric_learning.evaluation.load_knn_func` (a callable, a name or a
            mapping with options). Defaults to ``"custom"``: squared Euclidean CustomKNN.
        block_size: Query rows each rank contributes to one exchange step.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective before raising
            :class:`DistributedEvaluationError`; ``None`` uses the group's timeout.
        is_inverted: Whether larger values are nearer (similarities). ``None`` reads the
            local backend's declaration with
            :func:`~pytorch_metric_learning.evaluation.knn_is_inverted`.

    Example:
        >>> import torch
        >>> import torch.distributed as dist
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "init")
        >>> dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
        >>> knn = DistributedKNN(block_size=2)
        >>> distances, indices = knn(torch.tensor([[0.0], [3.0]]), 1, torch.tensor([[1.0], [2.5]]))
        >>> indices.tolist(), distances.tolist()
        ([[0], [1]], [[1.0], [0.25]])
        >>> dist.destroy_process_group()
    """

    def __init__(
        self,
        knn_func: Any = "custom",
        *,
        block_size: int = 1024,
        group: Any = None,
        timeout: float | timedelta | None = None,
        is_inverted: bool | None = None,
    ) -> None:
        self.local: KNNFunc = load_knn_func(knn_func)
        self.block_size = check_positive_int(block_size, "block_size", _OWNER)
        self.group = group
        self.timeout = resolve_timeout(timeout, _OWNER)
        if is_inverted is None:
            is_inverted = knn_is_inverted(self.local)
        elif not isinstance(is_inverted, bool):
            raise invalid("is_inverted", _OWNER, "None or a bool", is_inverted)
        self.is_inverted = is_inverted

    def __repr__(self) -> str:
        return (
            f"DistributedKNN({self.local!r}, block_size={self.block_size}, "
            f"is_inverted={self.is_inverted})"
        )

    @torch.no_grad()
    def __call__(
        self, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
        ref_includes_query: bool = False, *, exclusion: ShardExclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Neighbours of this rank's ``query`` rows among every rank's ``reference`` rows.

        Every rank of the group must call it, with the same ``k`` and
        ``ref_includes_query``, and an ``exclusion`` on every rank or on none.
        ``reference=None`` uses each rank's query shard. Returns ``(distances, indices)``
        shaped ``(len(query), k)`` with global indices (``-1`` past a row's candidates).
        """
        distances, indices, _ = self._search(
            query, k, reference, ref_includes_query, None, exclusion
        )
        return distances, indices

    @torch.no_grad()
    def search_with_labels(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None,
        reference_labels: torch.Tensor,
        ref_includes_query: bool = False,
        *,
        exclusion: ShardExclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like calling the backend, and also return each neighbour's label.

        The labels travel with the partial results, so no rank needs the labels of the
        whole reference. ``reference_labels`` has one label (or label row) per row of this
        rank's reference shard (of the query shard when ``reference`` is None).

        Returns:
            ``(distances, indices, labels)``; ``labels`` is shaped
            ``(len(query), k, *reference_labels.shape[1:])``.

        Example:
            >>> import os, tempfile
            >>> import torch.distributed as dist
            >>> path = os.path.join(tempfile.mkdtemp(), "init")
            >>> dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
            >>> x = torch.tensor([[0.0], [1.0], [5.0]])
            >>> _, indices, labels = DistributedKNN().search_with_labels(
            ...     x, 1, None, torch.tensor([7, 8, 9]), ref_includes_query=True)
            >>> indices.tolist(), labels.tolist()
            ([[1], [0], [1]], [[8], [7], [8]])
            >>> dist.destroy_process_group()
        """
        distances, indices, labels = self._search(
            query, k, reference, ref_includes_query, reference_labels, exclusion
        )
        assert labels is not None
        return distances, indices, labels

    def _search(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None,
        ref_includes_query: bool,
        labels: torch.Tensor | None,
        exclusion: ShardExclusion | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        comm = resolve_comm(self.group, self.timeout, _device_of(query))
        layout, search_k, flags = self._plan(
            comm, query, k, reference, ref_includes_query, labels, exclusion
        )
        scaled = self._in_float_range(comm, query, query if reference is None else reference)
        query, reference = scaled.query, scaled.reference
        trailing: tuple[int, ...] = ()
        if labels is not None:
            trailing = tuple(labels.shape[1:])
            labels = labels.to(query.device).reshape(len(labels), math.prod(trailing))
        ids = layout.reference_ids(comm.rank, query.device)
        rule = None
        if flags[0]:
            assert exclusion is not None
            rule = _shard_rule(comm, layout, exclusion, ids, bool(flags[1]), query.device)
        shard = _Shard(reference, ids, labels, rule)
        pieces = [
            self._step(comm, layout, step, query, shard, search_k)
            for step in range(layout.num_steps(self.block_size))
        ]
        found = _concat_results(pieces, query, search_k, labels)
        if ref_includes_query:
            own = layout.query_offset(comm.rank) + torch.arange(len(query), device=query.device)
            found = _drop_self_matches(found, own)
        distances, indices, found_labels = found
        indices = indices.masked_fill(indices == _NO_INDEX, -1)
        if found_labels is not None:
            found_labels = found_labels.reshape(*indices.shape, *trailing)
        return scaled.restore(distances, distances.dtype), indices, found_labels

    def _in_float_range(self, comm: Comm, query: torch.Tensor, reference: torch.Tensor) -> Rescaled:
        """The shards scaled by the power of two (exact) that brings the largest magnitude
        of every rank's rows near 1, where squared distances would overflow or underflow
        float32; every rank scales alike, so the partial lists merge in one unit."""
        local = torch.tensor([largest_magnitude(query, reference)], dtype=torch.float64)
        largest = float(all_reduce_max(comm, local, "finding the largest magnitude"))
        return rescale(getattr(self.local, "distance", None), query, reference, largest)

    def _plan(
        self,
        comm: Comm,
        query: Any,
        k: Any,
        reference: Any,
        ref_includes_query: Any,
        labels: Any,
        exclusion: Any = None,
    ) -> tuple[ShardLayout, int, tuple[bool, bool]]:
        """Check the inputs on every rank and agree on the layout; return it, the search k
        and whether an exclusion is applied and has pairs on some rank."""
        error, meta = None, [0] * 14
        try:
            meta = _local_meta(query, k, reference, ref_includes_query)
            meta += _labels_meta(labels, query if reference is None else reference)
            meta += _exclusion_meta(exclusion, query, query if reference is None else reference)
        except Exception as exc:
            error = exc
        table = agree(comm, error, "checking the inputs of DistributedKNN", meta)
        _check_same_everywhere(table)
        layout = ShardLayout(
            tuple(table[:, 0].tolist()), tuple(table[:, 1].tolist()), bool(table[0, 4])
        )
        flags = (bool(table[0, 10]), bool(table[:, 13].any()))
        return layout, _global_search_k(layout, int(table[0, 3])), flags

    def _step(
        self,
        comm: Comm,
        layout: ShardLayout,
        step: int,
        query: torch.Tensor,
        shard: _Shard,
        search_k: int,
    ) -> _Found:
        """One exchange: gather a block of queries, search locally, merge at the owners."""
        counts = layout.block_counts(step, self.block_size)
        start = step * self.block_size
        mine = query[start : start + counts[comm.rank]]
        stage = f"query block {step + 1} of {layout.num_steps(self.block_size)}"
        block = all_gather_rows(comm, mine, counts, f"gathering {stage}").to(query.device)
        exclusion = None
        if shard.rule is not None:
            exclusion = _block_exclusion(comm, layout, shard, start, counts, len(shard.ids))
        error, found = None, None
        try:
            found = self._search_shard(block, shard, search_k, exclusion)
        except Exception as exc:
            error = exc
        code = -1 if found is None else _DTYPES.index(found[0].dtype)
        codes = agree(comm, error, f"searching {stage}", [code])[:, 0].tolist()
        padded = self._pad(block, found, shard.labels, search_k, _common_dtype(codes))
        received = [
            None
            if part is None
            else all_to_all_rows(comm, part, counts, [counts[comm.rank]] * comm.world_size, stage)
            for part in padded
        ]
        return self._merge(received, comm.world_size, search_k, query.device)

    def _search_shard(
        self, block: torch.Tensor, shard: _Shard, search_k: int, exclusion: Exclusion | None
    ) -> _Found | None:
        """Top ``min(search_k, len(shard))`` of the block in this shard, global indices;
        under an exclusion, only candidates (the rest padded with the worst entries)."""
        reference = shard.reference
        k = min(search_k, len(reference))
        if k == 0:
            return None
        if exclusion is not None:
            return self._search_shard_excluding(block, shard, k, exclusion)
        distances, indices = self.local(block, k, reference, False)
        if indices.shape != (len(block), k) or distances.shape != indices.shape:
            raise BackendRuntimeError(
                f"The local k-NN backend {self.local!r} of {_OWNER} returned shapes "
                f"{tuple(distances.shape)} and {tuple(indices.shape)}; expected {(len(block), k)}."
            )
        indices = indices.to(shard.ids.device, torch.long)
        if indices.numel() and (indices.min() < 0 or indices.max() >= len(reference)):
            raise BackendRuntimeError(
                f"The local k-NN backend {self.local!r} of {_OWNER} returned indices outside "
                f"its reference shard of {len(reference)} rows."
            )
        labels = None if shard.labels is None else shard.labels[indices]
        return distances.to(shard.ids.device), shard.ids[indices], labels

    def _search_shard_excluding(
        self, block: torch.Tensor, shard: _Shard, k: int, exclusion: Exclusion
    ) -> _Found:
        """The block's first ``k`` candidates in this shard; invalid columns sort last."""
        distances, indices, valid = search_excluding(
            self.local, block, k, shard.reference, exclusion, caller=_OWNER
        )
        indices = indices.to(shard.ids.device, torch.long)
        valid = valid.to(shard.ids.device)
        labels = None if shard.labels is None else shard.labels[indices]
        worst = -torch.inf if self.is_inverted else torch.inf
        distances = distances.to(shard.ids.device).masked_fill(~valid, worst)
        ids = shard.ids[indices].masked_fill(~valid, _NO_INDEX)
        return distances, ids, labels

    def _pad(
        self,
        block: torch.Tensor,
        found: _Found | None,
        labels: torch.Tensor | None,
        search_k: int,
        dtype: torch.dtype,
    ) -> _Found:
        """Fill a shard's results to ``search_k`` columns with candidates that sort last."""
        worst = -torch.inf if self.is_inverted else torch.inf
        rows = len(block)
        distances = torch.full((rows, search_k), worst, dtype=dtype, device=block.device)
        indices = torch.full((rows, search_k), _NO_INDEX, device=block.device)
        padded_labels = None
        if labels is not None:
            padded_labels = labels.new_zeros((rows, search_k, labels.shape[1]))
        if found is not None:
            width = found[1].shape[1]
            distances[:, :width] = found[0]
            indices[:, :width] = found[1]
            if padded_labels is not None and found[2] is not None:
                padded_labels[:, :width] = found[2]
        return distances, indices, padded_labels

    def _merge(
        self,
        received: list[torch.Tensor | None],
        world: int,
        search_k: int,
        device: torch.device,
    ) -> _Found:
        """Merge the ``world`` partial lists of each own query into one top ``search_k``."""
        parts = [
            None
            if part is None
            else part.to(device)
            .view(world, -1, search_k, *part.shape[2:])
            .transpose(0, 1)
            .reshape(-1, world * search_k, *part.shape[2:])
            for part in received
        ]
        distances, indices, labels = parts
        assert distances is not None and indices is not None
        order = merge_order(distances, indices, search_k, self.is_inverted)
        if labels is not None:
            labels = labels.gather(1, order.unsqueeze(2).expand(-1, -1, labels.shape[2]))
        return distances.gather(1, order), indices.gather(1, order), labels


_Found = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]


class _Shard(NamedTuple):
    """This rank's reference rows, their global indices and (flattened) labels."""

    reference: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor | None
    rule: ShardRule | None = None


def merge_order(
    distances: torch.Tensor, indices: torch.Tensor, k: int, largest: bool
) -> torch.Tensor:
    """Columns of the ``k`` best candidates of each row: by distance, then by index.

    Example:
        >>> d = torch.tensor([[0.5, 0.2, 0.5, 0.9]])
        >>> i = torch.tensor([[7, 3, 1, 0]])
        >>> merge_order(d, i, 3, largest=False).tolist()
        [[1, 2, 0]]
    """
    by_index = torch.argsort(indices, dim=1, stable=True)
    by_distance = torch.argsort(
        distances.gather(1, by_index), dim=1, descending=largest, stable=True
    )
    return by_index.gather(1, by_distance[:, :k])


def merge_top_k(
    distances: torch.Tensor, indices: torch.Tensor, k: int, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best candidates of each row, ordered by distance, then by index.

    Example:
        >>> d = torch.tensor([[0.5, 0.2, 0.5, 0.9]])
        >>> i = torch.tensor([[7, 3, 1, 0]])
        >>> merge_top_k(d, i, 3, largest=False)[1].tolist()
        [[3, 1, 7]]
    """
    order = merge_order(distances, indices, k, largest)
    return distances.gather(1, order), indices.gather(1, order)


def _device_of(query: Any) -> torch.device:
    return query.device if isinstance(query, torch.Tensor) else torch.device("cpu")


def _local_meta(query: Any, k: Any, reference: Any, ref_includes_query: Any) -> list[int]:
    """This rank's ``[num_query, num_reference, dims, k, ref_includes_query, dtype code]``."""
    query, reference = check_search_inputs(query, reference, _OWNER)
    k = check_positive_int(k, "k", _OWNER)
    if not isinstance(ref_includes_query, bool):
        raise invalid("ref_includes_query", _OWNER, "a bool", ref_includes_query)
    if ref_includes_query and len(reference) < len(query):
        raise InvalidArgumentError(
            f"With ref_includes_query=True, each rank's query shard must be the first rows of "
            f"its reference shard for {_OWNER}. Got {len(query)} query rows and "
            f"{len(reference)} reference rows instead."
        )
    if query.dtype not in _DTYPES:
        raise invalid("query", _OWNER, f"of a dtype in {list(_DTYPES)}", query.dtype)
    dtype = _DTYPES.index(query.dtype)
    return [len(query), len(reference), query.shape[1], k, int(ref_includes_query), dtype]


def _check_same_everywhere(table: torch.Tensor) -> None:
    """Raise on every rank when ranks disagree on what must be common to all of them."""
    for column, name in ((2, "number of columns"), (3, "k"), (4, "ref_includes_query")):
        values = table[:, column].tolist()
        if len(set(values)) > 1:
            raise InvalidArgumentError(
                f"The {name} of {_OWNER}'s inputs must be the same on every rank. "
                f"Got {values} (by rank) instead."
            )
    for column, name in ((10, "exclusion"), (11, "keys"), (12, "key width")):
        values = table[:, column].tolist()
        if len(set(values)) > 1:
            raise InvalidArgumentError(
                f"The {name} of {_OWNER}'s exclusion must be given alike on every rank "
                f"(an exclusion on all ranks or none, keys of one width). Got {values} "
                "(by rank) instead."
            )
    for column, name in ((6, "presence"), (7, "ndim"), (8, "row size"), (9, "dtype")):
        values = table[:, column].tolist()
        if len(set(values)) > 1:
            raise InvalidArgumentError(
                f"The reference labels' {name} must be the same on every rank for {_OWNER}. "
                f"Got {values} (by rank) instead."
            )
    codes = table[:, 5].tolist()
    if len(set(codes)) > 1:
        got = [str(_DTYPES[code]) for code in codes]
        raise InvalidArgumentError(
            f"The query dtype of {_OWNER} must be the same on every rank. Got {got} instead."
        )


def _global_search_k(layout: ShardLayout, k: int) -> int:
    """``k`` (or ``k + 1`` to drop self matches), checked against the global reference."""
    search_k = k + 1 if layout.ref_includes_query else k
    if search_k > layout.num_reference:
        most = layout.num_reference - (search_k - k)
        raise InvalidArgumentError(
            f"The 'k' parameter of {_OWNER} must be at most {most} for a global reference of "
            f"{layout.num_reference} rows"
            f"{' that includes the query' if layout.ref_includes_query else ''}. "
            f"Got {k} instead."
        )
    return search_k


def _common_dtype(codes: list[int]) -> torch.dtype:
    dtype: torch.dtype | None = None
    for code in codes:
        if code >= 0:
            found = _DTYPES[code]
            dtype = found if dtype is None else torch.promote_types(dtype, found)
    return dtype or torch.float32


def _concat_results(
    pieces: list[_Found], query: torch.Tensor, search_k: int, labels: torch.Tensor | None
) -> _Found:
    if pieces:
        found_labels = None
        if labels is not None:
            found_labels = torch.cat([p[2] for p in pieces if p[2] is not None])
        return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces]), found_labels
    empty = torch.empty((0, search_k), dtype=query.dtype, device=query.device)
    empty_labels = None if labels is None else labels.new_empty((0, search_k, labels.shape[1]))
    return empty, torch.empty((0, search_k), dtype=torch.long, device=query.device), empty_labels


def _drop_self_matches(found: _Found, own: torch.Tensor) -> _Found:
    """Drop each row's own global index, or its last candidate when absent (the contract)."""
    distances, indices, labels = found
    drop = indices == own.unsqueeze(1)
    drop[:, -1] |= ~drop.any(dim=1)
    keep = ~drop
    rows, width = len(indices), indices.shape[1] - 1
    if labels is not None:
        labels = labels[keep].view(rows, width, labels.shape[2])
    return distances[keep].view(rows, width), indices[keep].view(rows, width), labels


def _exclusion_meta(exclusion: Any, query: Any, reference: Any) -> list[int]:
    """``[has exclusion, has keys, key width, has pairs]`` for the agreement."""
    if exclusion is None:
        return [0, 0, 0, 0]
    if not isinstance(exclusion, ShardExclusion):
        raise invalid("exclusion", _OWNER, "None or a ShardExclusion", type(exclusion).__name__)
    return [1, *exclusion.check(len(query), len(reference))]


def _shard_rule(
    comm: Comm,
    layout: ShardLayout,
    exclusion: ShardExclusion,
    ids: torch.Tensor,
    any_pairs: bool,
    device: torch.device,
) -> ShardRule:
    """This rank's rule with the pairs of every rank whose reference is in its shard."""
    pairs = torch.zeros((0, 2), dtype=torch.long, device=device)
    if any_pairs:
        every = gather_pairs(comm, exclusion.pairs, device)
        check_pair_range(every, layout.num_query, layout.num_reference)
        pairs = local_pairs(every, ids)
    flags = exclusion.never_candidates
    return ShardRule(
        as_rows(exclusion.query_keys, device),
        as_rows(exclusion.reference_keys, device),
        pairs,
        None if flags is None or not bool(flags.any()) else flags.to(device),
    )


def _block_exclusion(
    comm: Comm,
    layout: ShardLayout,
    shard: _Shard,
    start: int,
    counts: list[int],
    num_reference: int,
) -> Exclusion:
    """The local rule of one gathered query block: its rows' keys travel with it."""
    rule = shard.rule
    assert rule is not None
    device = shard.ids.device
    block_ids = torch.cat(
        [
            torch.arange(
                layout.query_offset(r) + start,
                layout.query_offset(r) + start + count,
                device=device,
            )  # fmt: skip
            for r, count in enumerate(counts)
        ]
    )
    keys = None
    if rule.query_keys is not None:
        mine = rule.query_keys[start : start + counts[comm.rank]]
        keys = all_gather_rows(comm, mine, counts, "gathering the query keys").to(device)
    return rule.for_block(block_ids, keys, num_reference)


def _labels_meta(labels: Any, reference: Any) -> list[int]:
    """``[has labels, label ndim, label width, dtype code]`` for the agreement."""
    if labels is None:
        return [0, 0, 0, 0]
    check_tensor(labels, "reference_labels", _OWNER)
    if labels.ndim == 0 or len(labels) != len(reference):
        raise invalid(
            "reference_labels",
            _OWNER,
            f"one label per reference row ({len(reference)})",
            f"shape {tuple(labels.shape)}",
        )
    if labels.dtype not in _LABEL_DTYPES:
        raise invalid(
            "reference_labels", _OWNER, f"of a dtype in {list(_LABEL_DTYPES)}", labels.dtype
        )
    return [1, labels.ndim, math.prod(labels.shape[1:]), _LABEL_DTYPES.index(labels.dtype)]
