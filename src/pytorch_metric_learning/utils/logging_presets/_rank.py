"""Which process writes records and checkpoints when every rank runs the same loop."""

from __future__ import annotations

__all__ = ["is_main_process"]


def is_main_process() -> bool:
    """True on rank 0 of an initialized ``torch.distributed`` default group, or without one.

    Example:
        >>> is_main_process()  # no process group here
        True
    """
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
