"""Code that runs inside the spawned ranks of the AccuracyAccumulator tests.

Each rank reads the validation set through a ``DistributedSampler`` that pads, feeds its
batches to an :class:`AccuracyAccumulator` and saves what ``compute()`` returned (or the
error it raised) for every case.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from _gloo import join_gloo_group, spawn_ranks


def spawn(cases: list[dict[str, Any]], world_size: int, directory: str) -> list[dict[str, Any]]:
    """Run every case on a fresh gloo group of ``world_size`` CPU processes; results by rank."""
    return spawn_ranks(_main, cases, world_size, directory)


def _main(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    join_gloo_group(directory, rank, world_size, 20)
    cases = torch.load(os.path.join(directory, "plan.pt"), weights_only=False)
    results = {case["name"]: _run(case, rank, world_size) for case in cases}
    torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _run(case: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    from pytorch_metric_learning.evaluation.distributed import AccuracyAccumulator

    dataset = TensorDataset(case["embeddings"], case["labels"], torch.arange(len(case["labels"])))
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=case["shuffle"], seed=case["seed"]
    )
    loader = DataLoader(dataset, batch_size=case["batch_size"], sampler=sampler)
    if case.get("rank0_only"):  # rank 0 reads every row in order, the others none
        loader = DataLoader(dataset, batch_size=case["batch_size"]) if rank == 0 else []
    accumulator = AccuracyAccumulator(**case["options"])
    try:
        for epoch in range(2):  # the second epoch must not see the first one's rows
            sampler.set_epoch(epoch)
            for number, (embeddings, labels, indices) in enumerate(loader):
                if number >= case.get("batches", len(loader)):
                    break
                accumulator.update(embeddings, labels, indices if case["indices"] else None)
            value = accumulator.compute()
            accumulator.reset()
    except Exception as error:
        return {"error_type": type(error).__name__, "message": str(error)}
    return {"value": value}
