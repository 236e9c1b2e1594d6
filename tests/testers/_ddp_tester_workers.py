"""Runs the distributed tester cases, in the spawned ranks and (as the oracle) in one process.

A *case* is a plain dict with the whole datasets; :func:`run_case` builds the same tester
with or without ``distributed=True``, so the ranks' results can be compared with the
single-process tester's on the same data.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from _gloo import join_gloo_group, spawn_ranks

GROUP_TIMEOUT_S = 20


def spawn(plan: list[dict[str, Any]], world_size: int, directory: str) -> list[dict[str, Any]]:
    """Run every case of ``plan`` on a fresh gloo group of ``world_size`` CPU processes."""
    return spawn_ranks(_main, plan, world_size, directory)


def _main(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    join_gloo_group(directory, rank, world_size, GROUP_TIMEOUT_S)
    plan = torch.load(os.path.join(directory, "plan.pt"), weights_only=False)
    results = {}
    for case in plan:
        try:
            results[case["name"]] = {"value": run_case(case, rank=rank)}
        except Exception as error:
            results[case["name"]] = {
                "error_mro": [cls.__name__ for cls in type(error).__mro__],
                "message": str(error),
                "traceback": traceback.format_exc(),
            }
    torch.save(results, os.path.join(directory, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class CountingModel(torch.nn.Module):
    """A fixed-seed linear model that counts its forward passes (and may fail)."""

    def __init__(self, dims_in: int, dims_out: int, seed: int, fail: bool = False) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.linear = torch.nn.Linear(dims_in, dims_out)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(dims_out, dims_in, generator=generator))
            self.linear.bias.copy_(torch.randn(dims_out, generator=generator))
        self.calls = 0
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fail:
            raise RuntimeError("injected failure in the model")
        return self.linear(x)


class FirstColumns:
    """A stand-in visualizer: its 'projection' is the first two columns."""

    def fit_transform(self, x: Any) -> Any:
        return x[:, :2]


def run_case(case: dict[str, Any], rank: int | None = None) -> dict[str, Any]:
    """The case's tester run on ``rank`` (distributed), or in one process if ``rank`` is None."""
    from pytorch_metric_learning.evaluation import AccuracyCalculator
    from pytorch_metric_learning.evaluation.distributed import (
        DistributedAccuracyCalculator,
        DistributedKMeans,
    )

    distributed = rank is not None
    out: dict[str, Any] = {"hook": [], "visualized": []}
    if distributed:
        calculator = DistributedAccuracyCalculator(**case["calc"], timeout=GROUP_TIMEOUT_S)
    else:  # the same k-means algorithm, so that NMI and AMI compare like with like
        calculator = AccuracyCalculator(**case["calc"], kmeans_func=DistributedKMeans())
    hooks = None
    if case.get("hook_container"):  # each rank records into a folder of its own
        from pytorch_metric_learning.utils import logging_presets

        record_keeper, _, _ = logging_presets.get_record_keeper(tempfile.mkdtemp())
        hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = _tester(case, calculator, distributed, out, hooks)
    model = CountingModel(
        case["dims_in"], 4, seed=3, fail=rank is not None and rank == case.get("fail_on_rank")
    )
    datasets = _datasets(case, rank)
    out["accuracies"] = tester.test(datasets, 7, model, splits_to_eval=case.get("splits_to_eval"))
    out["forward_calls"] = model.calls
    if hooks is not None:
        out["recorded_groups"] = hooks.record_keeper.groups()
        out["best"] = hooks.get_best_epoch_and_accuracy(None, "val")
    if "embed_split" in case:
        out["all_embeddings"] = tester.get_all_embeddings(datasets[case["embed_split"]], model)
    return out


def _tester(
    case: dict[str, Any], calculator: Any, distributed: bool, out: dict[str, Any], hooks: Any
) -> Any:
    from pytorch_metric_learning import testers

    def hook(tester: Any) -> None:
        out["hook"].append(
            {
                "accuracies": {k: dict(v) for k, v in tester.all_accuracies.items()},
                "rows": {
                    name: (rows.clone(), labels.clone())
                    for name, (rows, labels) in tester.embeddings_and_labels.items()
                },
            }
        )
        if hooks is not None:
            hooks.end_of_testing_hook(tester)

    def visualizer_hook(visualizer, points, labels, split_name, keyname, epoch) -> None:
        out["visualized"].append((points.copy(), labels.copy(), split_name, keyname, epoch))

    options = dict(case.get("options", {}))
    if options.pop("visualize", False):
        options.update(visualizer=FirstColumns(), visualizer_hook=visualizer_hook)
    tester_class = getattr(testers, case["tester"])
    return tester_class(
        accuracy_calculator=calculator,
        end_of_testing_hook=hook,
        distributed=distributed,
        batch_size=4,
        dataloader_num_workers=0,
        data_device="cpu",
        progress_bar=False,
        **options,
    )


def _datasets(case: dict[str, Any], rank: int | None) -> dict[str, TensorDataset]:
    datasets = {}
    for name, tensors in case["splits"].items():
        cut = case.get("length_on_rank", {}).get(rank)
        datasets[name] = TensorDataset(*(t if cut is None else t[:cut] for t in tensors))
    return datasets
