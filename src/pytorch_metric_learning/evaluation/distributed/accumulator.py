"""AccuracyAccumulator: the metrics of a validation set that arrives batch by batch.

A training loop's validation epoch hands over embeddings one batch at a time; under DDP
each rank sees only the batches of its own sampler, and a ``DistributedSampler`` repeats a
few rows so that every rank gets as many. The accumulator keeps each rank's rows where they
are, drops the repeated ones (by dataset index, or by the sampler's layout), and evaluates
the self-search of the whole set: with :class:`AccuracyCalculator` in one process, with the
sharded :class:`DistributedAccuracyCalculator` when a process group exists (no rank ever
holds the whole set). It imports no training framework; ``integrations.lightning`` wires
it into Lightning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from ..._validation import check_matrix, check_positive_int, check_tensor, invalid
from ...errors import InvalidArgumentError, InvalidTypeError
from ..retrieval.accuracy_calculator import AccuracyCalculator, MetricValue
from ._collectives import agree, all_gather_rows, resolve_comm, resolve_timeout
from ._labels import _unique, global_label_counts
from .accuracy import DistributedAccuracyCalculator
from .knn import _LABEL_DTYPES

logger = logging.getLogger(__name__)

__all__ = ["AccuracyAccumulator", "distributed_sampler_rows", "first_occurrences"]

_OWNER = "AccuracyAccumulator"


class AccuracyAccumulator:
    """Accumulate a validation set's embeddings batch by batch, then compute its metrics.

    Call :meth:`update` with each validation batch, :meth:`compute` at the end of the
    epoch (every rank, under DDP), then :meth:`reset`. The metrics are those of
    ``AccuracyCalculator(**calculator_options).get_accuracy(embeddings, labels)`` on the
    whole set: a self-search, each row a query among all the others.

    **Under DDP** (``torch.distributed`` initialized when :meth:`compute` runs, on the
    default group or ``group``) each rank keeps its own rows, and the metrics come from a
    :class:`DistributedAccuracyCalculator` built with the same options: they equal the
    single-process metrics of every rank's rows concatenated in rank order, and every rank
    returns them. A ``DistributedSampler`` (``drop_last=False``, the default, and what
    Lightning puts under a validation loader) pads the ranks to the same length by repeating
    the first rows of its order; counting those twice would be wrong, so under DDP one of
    two facts is required:

    - ``indices`` passed to every :meth:`update` (each row's index in the dataset): of rows
      with the same index, the first in rank order is kept and the others dropped. It works
      with any sampler, shuffled or not.
    - ``num_samples``, the dataset's length, for a ``DistributedSampler`` iterated whole: it
      deals the padded order round-robin, so the padding is the last row of the ranks from
      ``num_samples % world_size`` on, and each rank keeps its first
      ``len(range(rank, num_samples, world_size))`` rows. A sampler that does not pad (the
      ranks' rows add up to ``num_samples``) keeps every row. Any other total (a loader cut
      short by ``limit_val_batches``, ``drop_last=True``) raises ``ValueError`` on every rank.
      What it cannot see: a ``num_samples`` too large by less than the world size (say 24
      for a set of 23 on 2 ranks) matches the padded counts too, and the padding row is
      then counted as a row of its own. Pass ``indices`` (or let
      :class:`~pytorch_metric_learning.integrations.lightning.AccuracyCallback` read the
      length from the validation dataloader's dataset) to rule that out.

    With **both** given, the number of distinct ``indices`` received (on all ranks) must
    equal ``num_samples``, or :meth:`compute` raises ``ValueError`` naming both: a loader
    cut short or a ``drop_last`` sampler is then refused rather than evaluated on part of
    the set. Give ``indices`` alone to evaluate whatever rows arrive.

    Every batch since the last :meth:`reset` must have embeddings of the same width and
    labels of the same trailing shape and dtype (and, under DDP, the same on every rank
    that received rows); :meth:`update` refuses a batch that differs, naming it.

    Args:
        num_samples: The validation dataset's length (see above). In one process it is
            checked against the rows received, or the distinct ``indices``.
        group: The process group (``None``: the default group).
        timeout: Seconds (or a ``timedelta``) to wait for each collective under DDP.
        **calculator_options: :class:`AccuracyCalculator`'s arguments (``include``,
            ``exclude``, ``k``, ``avg_of_avgs``, ``knn_func`` ...). Under DDP, ``knn_func``
            is the local backend of each rank and ``kmeans_func`` must be ``None`` (see
            :class:`DistributedAccuracyCalculator`).

    Example:
        >>> import torch
        >>> accumulator = AccuracyAccumulator(include=("precision_at_1",))
        >>> accumulator.update(torch.tensor([[0.0], [0.1]]), torch.tensor([0, 0]))
        >>> accumulator.update(torch.tensor([[1.0], [1.2]]), torch.tensor([1, 1]))
        >>> accumulator.compute()
        {'precision_at_1': 1.0}
        >>> accumulator.reset()
    """

    def __init__(
        self,
        *,
        num_samples: int | None = None,
        group: Any = None,
        timeout: float | timedelta | None = None,
        **calculator_options: Any,
    ) -> None:
        self.num_samples = (
            None if num_samples is None else check_positive_int(num_samples, "num_samples", _OWNER)
        )
        self.group = group
        self.timeout = resolve_timeout(timeout, _OWNER)
        self.calculator_options = dict(calculator_options)
        self.calculator = AccuracyCalculator(**calculator_options)  # checks the options now
        self._distributed_calculator: DistributedAccuracyCalculator | None = None
        self._embeddings: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []
        self._indices: list[torch.Tensor] = []
        self.last_class_labels: list[Any] = []

    @property
    def num_rows(self) -> int:
        """Rows received on this rank since the last :meth:`reset`, padding included."""
        return sum(len(part) for part in self._embeddings)

    def update(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor | None = None
    ) -> None:
        """Keep one batch: ``(batch, dims)`` float embeddings, one label (or label row) per
        row, and optionally each row's integer index in the dataset.

        The tensors are detached and kept on their device; nothing is copied to the CPU,
        and nothing is copied at all: the accumulator keeps references, so a tensor changed
        in place after ``update`` (a reused buffer) changes what :meth:`compute` sees. Pass
        ``embeddings.clone()`` if you reuse the buffer.

        Raises:
            ValueError: a batch unlike the earlier ones since :meth:`reset` (the embeddings'
                width or device, the labels' trailing shape or dtype), or ``indices`` in
                some batches only.
        """
        check_matrix(embeddings, "embeddings", f"{_OWNER}.update")
        check_tensor(labels, "labels", f"{_OWNER}.update")
        _check_rows(labels, "labels", len(embeddings))
        if indices is not None:
            check_tensor(indices, "indices", f"{_OWNER}.update")
            _check_indices(indices, len(embeddings))
        if self._embeddings:
            _check_like_before(embeddings, self._embeddings[0])
            _check_labels_like_before(labels, self._labels[0])
        if self._embeddings and (indices is None) != (not self._indices):
            raise InvalidArgumentError(
                f"The 'indices' parameter of {_OWNER}.update must be given in every batch or "
                f"in none since the last reset(). Got {'none' if indices is None else 'some'} "
                "now and the opposite before."
            )
        self._embeddings.append(embeddings.detach())
        self._labels.append(labels.detach())
        if indices is not None:
            self._indices.append(indices.detach().reshape(-1))

    def reset(self) -> None:
        """Forget every row received (call it at the start or end of each epoch)."""
        self._embeddings, self._labels, self._indices = [], [], []

    def compute(self) -> dict[str, MetricValue]:
        """The metrics of every row received (on every rank, under DDP), padding removed.

        Also sets :attr:`last_class_labels`: the labels (a list per label row) that a
        per-class result (``return_per_class=True``) lists values for, in its order: the
        distinct labels with two rows or more (a label seen once has no relevant neighbour).

        Under DDP every rank of the group must call it. Returns the same dict on every rank.

        Raises:
            ValueError: no row was received (on any rank), or under DDP neither ``indices``
                nor ``num_samples`` tells the padding apart, or the rows received do not
                add up to ``num_samples``, or the distinct ``indices`` are not
                ``num_samples``.
        """
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return self._compute_distributed()
        embeddings, labels, indices = self._concatenated()
        keep = self._kept_rows(indices, [len(embeddings)], 0)
        if not bool(keep.any()):
            raise InvalidArgumentError(
                f"{_OWNER}.compute found no rows: call update() with the validation batches first."
            )
        labels = labels[keep.to(labels.device)]
        self.last_class_labels = _class_labels(*_unique(labels)[::2])
        return self.calculator.get_accuracy(embeddings[keep], labels)

    # ----- under DDP -----

    def _compute_distributed(self) -> dict[str, MetricValue]:
        embeddings, labels, indices = self._concatenated()
        comm = resolve_comm(self.group, self.timeout, embeddings.device)
        stage = f"counting the rows of {_OWNER}"
        # whether this rank's batches came with indices: 0 no, 1 yes, 2 no batch at all
        with_indices = 2 if not self._embeddings else int(indices is not None)
        facts = [len(embeddings), with_indices, embeddings.shape[1], *_label_facts(labels)]
        table = agree(comm, None, stage, facts)
        _check_labels_everywhere(table[table[:, 0] > 0])
        counts = table[:, 0].tolist()
        given = {int(flag) for flag in table[:, 1] if flag != 2}
        if len(given) > 1:
            raise InvalidArgumentError(
                f"The 'indices' of {_OWNER}.update must be given on every rank or on none. "
                f"Got them on ranks {(table[:, 1] == 1).nonzero().flatten().tolist()} only."
            )
        if not self._embeddings:  # a rank without rows still takes part, with 0 rows
            embeddings = embeddings.new_zeros((0, int(table[:, 2].max())))
            labels = _no_labels(table[table[:, 0] > 0][0], labels.device)
            indices = torch.zeros(0, dtype=torch.long) if given == {1} else None
        if indices is not None:
            indices = all_gather_rows(comm, indices, counts, "gathering the dataset indices")
        keep = self._kept_rows(indices, counts, comm.rank)
        if sum(counts) == 0:
            raise InvalidArgumentError(
                f"{_OWNER}.compute found no rows on any of the {comm.world_size} ranks: call "
                "update() with the validation batches first."
            )
        labels = labels[keep.to(labels.device)]
        unique, label_counts = global_label_counts(comm, labels, "counting the labels")
        self.last_class_labels = _class_labels(unique, label_counts)
        return self._distributed().get_accuracy(embeddings[keep.to(embeddings.device)], labels)

    def _distributed(self) -> DistributedAccuracyCalculator:
        if self._distributed_calculator is None:
            self._distributed_calculator = DistributedAccuracyCalculator(
                group=self.group, timeout=self.timeout, **self.calculator_options
            )
        return self._distributed_calculator

    # ----- which rows count -----

    def _concatenated(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if not self._embeddings:
            return torch.zeros((0, 0)), torch.zeros(0, dtype=torch.long), None
        embeddings = torch.cat(self._embeddings)
        labels = torch.cat(self._labels)
        indices = torch.cat(self._indices) if self._indices else None
        return embeddings, labels, indices

    def _kept_rows(
        self, gathered_indices: torch.Tensor | None, counts: Sequence[int], rank: int
    ) -> torch.Tensor:
        """Boolean mask of this rank's rows that count (padding and repeats dropped)."""
        start = sum(counts[:rank])
        if gathered_indices is not None:
            first = first_occurrences(gathered_indices.cpu())
            self._check_distinct(int(first.sum()))
            return first[start : start + counts[rank]]
        if self.num_samples is None:
            if len(counts) > 1:
                raise InvalidArgumentError(
                    f"{_OWNER} under DDP ({len(counts)} ranks) needs 'indices' in update() or "
                    "'num_samples' (the dataset's length): a DistributedSampler repeats rows "
                    "to even out the ranks, and they must be counted once."
                )
            return torch.ones(counts[rank], dtype=torch.bool)
        kept = distributed_sampler_rows(self.num_samples, counts)
        mask = torch.zeros(counts[rank], dtype=torch.bool)
        mask[: kept[rank]] = True
        return mask

    def _check_distinct(self, distinct: int) -> None:
        """With both facts given, the distinct indices received are the whole dataset."""
        if self.num_samples is not None and distinct != self.num_samples:
            raise InvalidArgumentError(
                f"The 'indices' given to {_OWNER}.update name {distinct} distinct dataset "
                f"rows, but 'num_samples' is {self.num_samples}: with both given, every row "
                "of the dataset must arrive, on some rank, at least once. "
                "Evaluate the whole validation set (no limit_val_batches, drop_last=False), "
                "or leave out num_samples to evaluate the rows that arrive."
            )


def first_occurrences(indices: torch.Tensor) -> torch.Tensor:
    """Boolean mask: ``True`` where a value of the 1-D ``indices`` occurs for the first time.

    Example:
        >>> first_occurrences(torch.tensor([3, 1, 3, 0, 1])).tolist()
        [True, True, False, True, False]
    """
    if indices.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    _, inverse = torch.unique(indices, return_inverse=True)
    positions = torch.arange(len(indices))
    first = torch.full((int(inverse.max()) + 1,), len(indices), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    return first[inverse] == positions


def distributed_sampler_rows(num_samples: int, counts: Sequence[int]) -> list[int]:
    """How many leading rows of each rank are real, for a ``DistributedSampler`` read whole.

    ``counts`` are the rows each rank received. With padding (every rank got
    ``ceil(num_samples / world_size)``), rank ``r`` keeps ``len(range(r, num_samples,
    world_size))``; without (the counts add up to ``num_samples``), every row.

    Example:
        >>> distributed_sampler_rows(5, [3, 3])
        [3, 2]
        >>> distributed_sampler_rows(5, [2, 3])
        [2, 3]
    """
    world = len(counts)
    total = sum(counts)
    if total == num_samples:
        return list(counts)
    padded = -(-num_samples // world)
    if all(count == padded for count in counts):
        return [len(range(rank, num_samples, world)) for rank in range(world)]
    raise InvalidArgumentError(
        f"The rows given to {_OWNER}.update on the {world} ranks ({list(counts)}, {total} in "
        f"all) are neither num_samples={num_samples} nor a DistributedSampler's padded "
        f"{padded} per rank. Evaluate the whole validation set (no limit_val_batches, "
        "drop_last=False), or pass each row's dataset index as 'indices'."
    )


def _check_like_before(embeddings: torch.Tensor, first: torch.Tensor) -> None:
    """Every batch since the last reset has the columns and device of the first."""
    if embeddings.shape[1] != first.shape[1] or embeddings.device != first.device:
        raise invalid(
            "embeddings", f"{_OWNER}.update",
            f"{first.shape[1]} columns on {first.device}, as the earlier batches since reset()",
            f"{embeddings.shape[1]} columns on {embeddings.device}",
        )  # fmt: skip


def _check_labels_like_before(labels: torch.Tensor, first: torch.Tensor) -> None:
    """Every batch since the last reset has labels of the trailing shape and dtype of the
    first: concatenating them would fail deep inside torch, or mix label kinds."""
    if labels.shape[1:] != first.shape[1:] or labels.dtype != first.dtype:
        raise invalid(
            "labels", f"{_OWNER}.update",
            f"labels of shape (batch{''.join(f', {size}' for size in first.shape[1:])}) and dtype "
            f"{first.dtype}, as the earlier batches since reset()",
            f"shape {tuple(labels.shape)} and dtype {labels.dtype}",
        )  # fmt: skip


def _label_facts(labels: torch.Tensor) -> list[int]:
    """``[label ndim, label row size, dtype code]``: what every rank's labels must share."""
    code = _LABEL_DTYPES.index(labels.dtype) if labels.dtype in _LABEL_DTYPES else -1
    return [labels.ndim, math.prod(labels.shape[1:]), code]


def _check_labels_everywhere(table: torch.Tensor) -> None:
    """The ranks that received rows all have labels of one trailing shape and dtype."""
    facts = [tuple(row) for row in table[:, 3:].tolist()]
    if len(set(facts)) > 1:
        raise InvalidArgumentError(
            f"The 'labels' given to {_OWNER}.update must have the same trailing shape and "
            f"dtype on every rank. Got (ndim, row size, dtype code) {facts} on the ranks "
            "that received rows."
        )


def _no_labels(facts: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Zero rows of labels shaped like the other ranks' (for a rank that received none)."""
    ndim, size, code = (int(value) for value in facts[3:6])
    dtype = _LABEL_DTYPES[code] if code >= 0 else torch.long
    trailing = (size,) + (1,) * (ndim - 2) if ndim > 1 else ()
    return torch.zeros((0, *trailing), dtype=dtype, device=device)


def _class_labels(unique: torch.Tensor, counts: torch.Tensor) -> list[Any]:
    """The labels of a self-search's per-class results, in order: those with two or more
    rows (a label seen once has no relevant neighbour, so no per-class value)."""
    return unique[counts >= 2].tolist()


def _check_rows(labels: torch.Tensor, param: str, rows: int) -> None:
    if labels.ndim == 0 or len(labels) != rows:
        raise invalid(
            param, f"{_OWNER}.update", f"one label per embedding row ({rows})",
            f"shape {tuple(labels.shape)}",
        )  # fmt: skip


def _check_indices(indices: torch.Tensor, rows: int) -> None:
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise invalid(
            "indices", f"{_OWNER}.update", "an integer tensor", indices.dtype, InvalidTypeError
        )
    if indices.ndim != 1 or len(indices) != rows:
        raise invalid(
            "indices", f"{_OWNER}.update", f"a 1-D tensor of {rows} dataset indices",
            f"shape {tuple(indices.shape)}",
        )  # fmt: skip
