"""Joining a gloo process group through a file in a temporary folder, and spawning the
ranks of one, for DDP tests."""

from __future__ import annotations

import datetime
import os
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


def spawn_ranks(
    worker: Callable[[int, int, str], None], plan: Any, world_size: int, directory: str
) -> list[Any]:
    """Save ``plan`` as ``directory/plan.pt``, run ``worker(rank, world_size, directory)`` in
    ``world_size`` spawned processes, and return what each saved as ``rank<r>.pt``."""
    torch.save(plan, os.path.join(directory, "plan.pt"))
    mp.spawn(worker, args=(world_size, directory), nprocs=world_size, join=True)
    return [
        torch.load(os.path.join(directory, f"rank{rank}.pt"), weights_only=False)
        for rank in range(world_size)
    ]
