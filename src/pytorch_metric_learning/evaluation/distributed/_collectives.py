"""Collectives with timeouts, and errors that every rank of a group raises together.

Each helper runs one ``torch.distributed`` collective asynchronously and waits for it with
the caller's timeout, so that a rank that stopped participating (it raised, or never called
the evaluation) turns into a :class:`DistributedEvaluationError` on the others instead of
a hang. :func:`agree` lets a rank that failed locally tell the others, so that every rank
raises at the same step and the group stays usable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch

from ...errors import BackendRuntimeError, InvalidArgumentError

__all__ = [
    "Comm",
    "DistributedEvaluationError",
    "agree",
    "all_gather_ints",
    "all_gather_rows",
    "all_reduce_max",
    "all_reduce_sum",
    "all_to_all_rows",
    "broadcast",
    "resolve_comm",
    "resolve_timeout",
]

logger = logging.getLogger(__name__)

# Longest error message (bytes) a failing rank sends to the others.
_MAX_MESSAGE = 2000


class DistributedEvaluationError(BackendRuntimeError):
    """Another rank failed, or a collective of a distributed evaluation failed or timed out."""


@dataclass(frozen=True)
class Comm:
    """A process group as one evaluation sees it."""

    group: Any
    rank: int
    world_size: int
    device: torch.device
    timeout: timedelta | None

    def global_rank(self, group_rank: int) -> int:
        """The rank in the default group of ``group_rank`` in this group."""
        import torch.distributed as dist

        if self.group is None:
            return group_rank
        return int(dist.get_global_rank(self.group, group_rank))


def resolve_timeout(timeout: Any, owner: str) -> timedelta | None:
    """``None``, positive seconds or a positive ``timedelta`` -> ``timedelta | None``."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        seconds = -1.0
    if not seconds > 0:
        raise InvalidArgumentError(
            f"The 'timeout' parameter of {owner} must be None, positive seconds or a positive "
            f"datetime.timedelta. Got {timeout!r} instead."
        )
    return timedelta(seconds=seconds)


def resolve_comm(group: Any, timeout: timedelta | None, data_device: torch.device) -> Comm:
    """Describe ``group`` (``None``: the default group) for one call on this rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedEvaluationError(
            "torch.distributed is not initialized. Call torch.distributed.init_process_group "
            "on every rank first (e.g. run under torchrun), or use a local backend such as "
            "'custom'."
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise DistributedEvaluationError(
            "This process is not a member of the 'group' passed to the distributed evaluation; "
            "call it only on the group's ranks."
        )
    device = _comm_device(str(dist.get_backend(group)), data_device)
    return Comm(group, rank, dist.get_world_size(group), device, timeout)


def _comm_device(backend: str, data_device: torch.device) -> torch.device:
    """Where tensors must live for ``backend``: CUDA for NCCL, CPU for gloo and MPI."""
    if data_device.type == "cuda" and "nccl" in backend:
        return data_device
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return data_device


def _run(comm: Comm, stage: str, start: Callable[[], Any]) -> None:
    """Start one asynchronous collective and wait for it, translating failures."""
    try:
        work = start()
        if comm.timeout is None:
            work.wait()
        else:
            work.wait(timeout=comm.timeout)
    except Exception as error:
        waited = f" within {comm.timeout.total_seconds():g} s" if comm.timeout else ""
        raise DistributedEvaluationError(
            f"The collective for {stage} failed on rank {comm.rank} of {comm.world_size}"
            f"{waited} ({type(error).__name__}: {error}). Another rank probably raised or "
            "stopped calling the evaluation: every rank of the group must make the same "
            "calls with the same arguments."
        ) from error


def all_gather_ints(comm: Comm, values: Sequence[int], stage: str) -> torch.Tensor:
    """Gather ``values`` (the same length on every rank) into a CPU ``(world, len)`` table."""
    import torch.distributed as dist

    mine = torch.tensor(list(values), dtype=torch.long, device=comm.device).reshape(-1)
    parts = [torch.empty_like(mine) for _ in range(comm.world_size)]
    _run(comm, stage, lambda: dist.all_gather(parts, mine, group=comm.group, async_op=True))
    return torch.stack(parts).cpu()


def all_gather_rows(
    comm: Comm, rows: torch.Tensor, counts: Sequence[int], stage: str
) -> torch.Tensor:
    """Concatenate every rank's ``rows`` in rank order; ``counts[r]`` is rank r's row count.

    Shards of different sizes are padded to the largest, so every rank must pass the same
    ``counts`` (known beforehand, e.g. from :func:`all_gather_ints`).
    """
    import torch.distributed as dist

    rows = rows.to(comm.device)
    if max(counts, default=0) == 0:  # every rank knows: nothing to exchange
        return rows.new_zeros((0, *rows.shape[1:]))
    padded = rows.new_zeros((max(counts), *rows.shape[1:]))
    padded[: len(rows)] = rows
    parts = [torch.empty_like(padded) for _ in range(comm.world_size)]
    _run(comm, stage, lambda: dist.all_gather(parts, padded, group=comm.group, async_op=True))
    return torch.cat([part[:count] for part, count in zip(parts, counts)])


def all_to_all_rows(
    comm: Comm,
    rows: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    stage: str,
) -> torch.Tensor:
    """Send ``rows[...]`` split by ``send_counts`` to each rank; receive ``recv_counts``."""
    import torch.distributed as dist

    rows = rows.to(comm.device).contiguous()
    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    _run(
        comm,
        stage,
        lambda: dist.all_to_all_single(
            out, rows, list(recv_counts), list(send_counts), group=comm.group, async_op=True
        ),
    )
    return out


def all_reduce_sum(comm: Comm, tensor: torch.Tensor, stage: str) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over the group, on ``tensor``'s device."""
    import torch.distributed as dist

    moved = tensor.to(comm.device, copy=True)
    _run(comm, stage, lambda: dist.all_reduce(moved, group=comm.group, async_op=True))
    return moved.to(tensor.device)


def all_reduce_max(comm: Comm, tensor: torch.Tensor, stage: str) -> torch.Tensor:
    """The element-wise maximum of ``tensor`` over the group, on ``tensor``'s device."""
    import torch.distributed as dist

    moved = tensor.to(comm.device, copy=True)
    maximum = dist.ReduceOp.MAX
    _run(comm, stage, lambda: dist.all_reduce(moved, maximum, comm.group, async_op=True))
    return moved.to(tensor.device)


def broadcast(comm: Comm, tensor: torch.Tensor, src: int, stage: str) -> torch.Tensor:
    """Rank ``src``'s ``tensor`` (group rank) on every rank, on ``tensor``'s device."""
    import torch.distributed as dist

    moved = tensor.to(comm.device, copy=True)
    source = comm.global_rank(src)
    _run(comm, stage, lambda: dist.broadcast(moved, source, group=comm.group, async_op=True))
    return moved.to(tensor.device)


def agree(
    comm: Comm, error: Exception | None, stage: str, values: Sequence[int] = ()
) -> torch.Tensor:
    """Exchange each rank's success and ``values``; raise on every rank if one failed.

    A rank that failed re-raises its own ``error``; the others raise
    :class:`DistributedEvaluationError` quoting the failed ranks' messages. On success,
    returns the CPU ``(world, len(values))`` table of every rank's ``values``.
    """
    table = all_gather_ints(comm, [int(error is not None), *values], stage)
    failed = table[:, 0].nonzero().flatten().tolist()
    if not failed:
        return table[:, 1:]
    messages = _gather_messages(comm, error, stage)
    if error is not None:
        raise error
    quoted = "; ".join(f"rank {rank}: {messages[rank]}" for rank in failed)
    raise DistributedEvaluationError(
        f"The distributed evaluation failed on rank(s) {failed} of {comm.world_size} while "
        f"{stage}, so rank {comm.rank} stops too. {quoted}"
    )


def _gather_messages(comm: Comm, error: Exception | None, stage: str) -> list[str]:
    text = "" if error is None else f"{type(error).__name__}: {error}"
    data = text.encode("utf-8")[:_MAX_MESSAGE]
    sizes = all_gather_ints(comm, [len(data)], stage)[:, 0].tolist()
    mine = torch.tensor(list(data), dtype=torch.uint8)
    gathered = all_gather_rows(comm, mine, sizes, stage).cpu()
    parts = torch.split(gathered, sizes)
    return [bytes(part.tolist()).decode("utf-8", errors="replace") for part in parts]
