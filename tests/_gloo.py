"""Joining a gloo process group through a file in a temporary folder, for DDP tests."""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist


def join_gloo_group(directory: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Join (or, with ``world_size=1``, form) the CPU group rendezvousing in ``directory``."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(directory, 'init')}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
