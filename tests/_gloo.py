"""Joining a gloo process group through a file in a temporary folder, and spawning the
ranks of one, for DDP tests."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def join_gloo_group(directory: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Join (or, with ``world_size=1``, form) the CPU group rendezvousing in ``directory``."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(directory, 'init')}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


# The longest the ranks of one spawn may run: a rank that waits on something no timeout of
# the group covers (a thread, a child process, an exit handler) fails its test, named,
# instead of holding the whole suite.
SPAWN_DEADLINE_S = 240.0


def spawn_ranks(
    worker: Callable[[int, int, str], None], plan: Any, world_size: int, directory: str
) -> list[Any]:
    """Save ``plan`` as ``directory/plan.pt``, run ``worker(rank, world_size, directory)`` in
    ``world_size`` spawned processes, and return what each saved as ``rank<r>.pt``.

    Ranks still running after ``SPAWN_DEADLINE_S`` seconds are killed and TimeoutError
    names them; a rank that fails raises as ``torch.multiprocessing.spawn`` does."""
    torch.save(plan, os.path.join(directory, "plan.pt"))
    context = mp.start_processes(
        worker, args=(world_size, directory), nprocs=world_size, join=False, start_method="spawn"
    )
    _join_by(context, time.monotonic() + SPAWN_DEADLINE_S)
    return [
        torch.load(os.path.join(directory, f"rank{rank}.pt"), weights_only=False)
        for rank in range(world_size)
    ]


def _join_by(context: Any, deadline: float) -> None:
    """Join the spawned ranks of ``context``; kill them all if ``deadline`` passes first."""
    while not context.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            running = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
            for process in context.processes:
                process.kill()
            for process in context.processes:
                process.join(10)
            raise TimeoutError(
                f"ranks {running} of {len(context.processes)} were still running after "
                f"{SPAWN_DEADLINE_S:.0f} s and were killed"
            )
