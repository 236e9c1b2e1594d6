"""What the training-loop hooks cost, against the same work done without them.

Baselines, measured in the same run:
  iteration  one optimizer step of a small MLP (64x128x32, batch 64), against one call
             of ``end_of_iteration_hook`` (records buffered, written every ``log_freq``)
  save       ``torch.save`` straight to the target file, against the atomic
             ``save_state_dict`` (temporary file, fsync, rename)
  epoch      recording one epoch's accuracies (5 metrics x 2 splits) to SQLite + CSV

Usage: python benchmarks/hooks.py [--iterations 2000] [--params 2000000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from _timing import best_of

from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.checkpoints import save_state_dict


def iteration_overhead(iterations: int, folder: Path) -> tuple[float, float]:
    """Seconds per bare training step, and per ``end_of_iteration_hook`` call."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randn(64, 32)
    record_keeper, _, _ = logging_presets.get_record_keeper(folder)
    hooks = logging_presets.get_hook_container(record_keeper)
    state = logging_presets.TrainingState(models={"trunk": model}, optimizers={"opt": optimizer})
    losses = []

    def steps() -> None:
        for _ in range(iterations):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss)

    def hook_calls() -> None:
        for i, loss in enumerate(losses[-iterations:]):
            state.global_iteration, state.losses = i, {"metric_loss": loss, "total_loss": loss}
            hooks.end_of_iteration_hook(state)

    bare = hook = float("inf")
    for _ in range(5):  # interleaved, so both see the same machine load
        bare = min(bare, best_of(1, steps))
        hook = min(hook, best_of(1, hook_calls))
    return bare / iterations, hook / iterations


def save_overhead(params: int, folder: Path) -> tuple[float, float]:
    state = {"weight": torch.randn(params)}
    plain = best_of(3, lambda: torch.save(state, folder / "plain.pth"))
    atomic = best_of(3, lambda: save_state_dict(state, folder / "atomic.pth"))
    return plain, atomic


def epoch_record_cost(folder: Path) -> float:
    record_keeper, _, _ = logging_presets.get_record_keeper(folder)
    hooks = logging_presets.get_hook_container(record_keeper)
    keys = ["precision_at_1", "r_precision", "mean_average_precision_at_r", "NMI", "AMI"]
    epochs = iter(range(1, 10_000))

    def one_epoch() -> None:
        epoch = next(epochs)
        table = {"epoch": epoch, **{f"{k}_level0": 0.5 for k in keys}}
        hooks.end_of_testing_hook(SimpleNamespace(all_accuracies={"val": table, "train": table}))

    return best_of(20, one_epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--params", type=int, default=2_000_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bare, hook = iteration_overhead(args.iterations, folder / "it")
        print(
            f"iteration: training step {bare * 1e6:.0f} us, end_of_iteration_hook "
            f"{hook * 1e6:.0f} us (hook / step = {hook / bare:.3f})"
        )
        plain, atomic = save_overhead(args.params, folder)
        mb = args.params * 4 / 1e6
        print(
            f"save {mb:.0f} MB: torch.save {plain * 1e3:.1f} ms, atomic {atomic * 1e3:.1f} ms "
            f"(ratio {atomic / plain:.2f})"
        )
        print(
            f"record one epoch (2 splits x 5 metrics): {epoch_record_cost(folder / 'ep') * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
