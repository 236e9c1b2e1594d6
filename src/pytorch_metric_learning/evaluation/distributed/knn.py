"""Exact k-NN over a reference sharded across the ranks of a ``torch.distributed`` group."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from ..._validation import check_positive_int, invalid
from ...errors import BackendRuntimeError, InvalidArgumentError
from ..knn import check_search_inputs, remove_self_matches
from ..protocols import KNNFunc
from ..registry import load_knn_func
from ._collectives import (
    Comm,
    agree,
    all_gather_rows,
    all_to_all_rows,
    resolve_comm,
    resolve_timeout,
)
from ._layout import ShardLayout

__all__ = ["DistributedKNN", "merge_top_k"]

_OWNER = "DistributedKNN"
# Dtypes a query or a distance may have, by code, for exchanging them as ints.
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
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

    Args:
        knn_func: The local exact backend, as a spec for
            :func:`~pytorch_metric_learning.evaluation.load_knn_func` (a callable, a name or a
            mapping with options). Defaults to ``"custom"``: squared Euclidean CustomKNN.
        block_size: Query rows each rank contributes to one exchange step.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective before raising
            :class:`DistributedEvaluationError`; ``None`` uses the group's timeout.
        is_inverted: Whether larger values are nearer (similarities). ``None`` takes
            ``knn_func.distance.is_inverted`` when the local backend has a distance, else False.

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
            is_inverted = bool(getattr(getattr(self.local, "distance", None), "is_inverted", False))
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
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbours of this rank's ``query`` rows among every rank's ``reference`` rows.

        Every rank of the group must call it, with the same ``k`` and
        ``ref_includes_query``. ``reference=None`` uses each rank's query shard.
        Returns ``(distances, indices)`` shaped ``(len(query), k)`` with global indices.
        """
        comm = resolve_comm(self.group, self.timeout, _device_of(query))
        layout, search_k = self._plan(comm, query, k, reference, ref_includes_query)
        reference = query if reference is None else reference
        ids = layout.reference_ids(comm.rank, query.device)
        pieces = [
            self._step(comm, layout, step, query, reference, ids, search_k)
            for step in range(layout.num_steps(self.block_size))
        ]
        distances, indices = _concat_results(pieces, query, search_k)
        if not ref_includes_query:
            return distances, indices
        offset = layout.query_offset(comm.rank)
        distances, local = remove_self_matches(distances, indices - offset)
        return distances, local + offset

    def _plan(
        self,
        comm: Comm,
        query: Any,
        k: Any,
        reference: Any,
        ref_includes_query: Any,
    ) -> tuple[ShardLayout, int]:
        """Check the inputs on every rank and agree on the layout; return it and the search k."""
        error, meta = None, [0] * 6
        try:
            meta = _local_meta(query, k, reference, ref_includes_query)
        except Exception as exc:
            error = exc
        table = agree(comm, error, "checking the inputs of DistributedKNN", meta)
        _check_same_everywhere(table)
        layout = ShardLayout(
            tuple(table[:, 0].tolist()), tuple(table[:, 1].tolist()), bool(table[0, 4])
        )
        return layout, _global_search_k(layout, int(table[0, 3]))

    def _step(
        self,
        comm: Comm,
        layout: ShardLayout,
        step: int,
        query: torch.Tensor,
        reference: torch.Tensor,
        ids: torch.Tensor,
        search_k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One exchange: gather a block of queries, search locally, merge at the owners."""
        counts = layout.block_counts(step, self.block_size)
        start = step * self.block_size
        mine = query[start : start + counts[comm.rank]]
        stage = f"query block {step + 1} of {layout.num_steps(self.block_size)}"
        block = all_gather_rows(comm, mine, counts, f"gathering {stage}").to(query.device)
        error, found = None, None
        try:
            found = self._search_shard(block, reference, ids, search_k)
        except Exception as exc:
            error = exc
        code = -1 if found is None else _DTYPES.index(found[0].dtype)
        codes = agree(comm, error, f"searching {stage}", [code])[:, 0].tolist()
        dtype = _common_dtype(codes)
        distances, indices = found or (None, None)
        distances, indices = self._pad(block, distances, indices, search_k, dtype)
        received = [
            all_to_all_rows(comm, part, counts, [counts[comm.rank]] * comm.world_size, stage)
            for part in (distances, indices)
        ]
        return self._merge(received, comm.world_size, search_k, query.device)

    def _search_shard(
        self, block: torch.Tensor, reference: torch.Tensor, ids: torch.Tensor, search_k: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Top ``min(search_k, len(reference))`` of the block in this shard, global indices."""
        k = min(search_k, len(reference))
        if k == 0:
            return None
        distances, indices = self.local(block, k, reference, False)
        if indices.shape != (len(block), k) or distances.shape != indices.shape:
            raise BackendRuntimeError(
                f"The local k-NN backend {self.local!r} of {_OWNER} returned shapes "
                f"{tuple(distances.shape)} and {tuple(indices.shape)}; expected {(len(block), k)}."
            )
        indices = indices.to(ids.device, torch.long)
        if indices.numel() and (indices.min() < 0 or indices.max() >= len(reference)):
            raise BackendRuntimeError(
                f"The local k-NN backend {self.local!r} of {_OWNER} returned indices outside "
                f"its reference shard of {len(reference)} rows."
            )
        return distances.to(ids.device), ids[indices]

    def _pad(
        self,
        block: torch.Tensor,
        distances: torch.Tensor | None,
        indices: torch.Tensor | None,
        search_k: int,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill a shard's results to ``search_k`` columns with candidates that sort last."""
        worst = -torch.inf if self.is_inverted else torch.inf
        padded_d = torch.full((len(block), search_k), worst, dtype=dtype, device=block.device)
        padded_i = torch.full((len(block), search_k), _NO_INDEX, device=block.device)
        if distances is not None and indices is not None:
            padded_d[:, : distances.shape[1]] = distances
            padded_i[:, : indices.shape[1]] = indices
        return padded_d, padded_i

    def _merge(
        self, received: list[torch.Tensor], world: int, search_k: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Merge the ``world`` partial lists of each own query into one top ``search_k``."""
        distances, indices = (
            part.to(device).view(world, -1, search_k).transpose(0, 1).reshape(-1, world * search_k)
            for part in received
        )
        return merge_top_k(distances, indices, search_k, self.is_inverted)


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
    order = torch.argsort(indices, dim=1, stable=True)
    distances, indices = distances.gather(1, order), indices.gather(1, order)
    order = torch.argsort(distances, dim=1, descending=largest, stable=True)[:, :k]
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
    pieces: list[tuple[torch.Tensor, torch.Tensor]], query: torch.Tensor, search_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if pieces:
        return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
    empty = torch.empty((0, search_k), dtype=query.dtype, device=query.device)
    return empty, torch.empty((0, search_k), dtype=torch.long, device=query.device)
