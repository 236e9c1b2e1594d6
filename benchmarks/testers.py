"""Embedding a split: the tester's forward pass against a plain hand-written loop.

Each measurement runs in a fresh subprocess, so its peak resident memory is its own.
Baseline, measured in the same run on the same data and model:
  loop    DataLoader + model + a list of batch outputs + torch.cat + normalize, the loop
          users write by hand (and the shape of 2.x's collection)
  tester  GlobalEmbeddingSpaceTester.get_all_embeddings: one preallocated tensor,
          normalized batch by batch (no progress bar, no workers, like the loop)

Usage: python benchmarks/testers.py [--sizes 100000,400000] [--dims 256] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from _memory import peak_rss_bytes
from torch.utils.data import DataLoader, TensorDataset

DIMS_IN = 32


def _setup(n: int, d: int) -> tuple[TensorDataset, torch.nn.Module]:
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(n, DIMS_IN, generator=generator)
    labels = torch.randint(0, 100, (n,), generator=generator)
    torch.manual_seed(0)
    return TensorDataset(data, labels), torch.nn.Linear(DIMS_IN, d)


def _loop(dataset: TensorDataset, model: torch.nn.Module, batch: int) -> torch.Tensor:
    outputs, labels = [], []
    model.eval()
    with torch.no_grad():
        for data, label in DataLoader(dataset, batch_size=batch, shuffle=False):
            outputs.append(model(data))
            labels.append(label)
    return torch.nn.functional.normalize(torch.cat(outputs), dim=1)


def _tester(dataset: TensorDataset, model: torch.nn.Module, batch: int) -> torch.Tensor:
    from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

    tester = GlobalEmbeddingSpaceTester(
        batch_size=batch,
        dataloader_num_workers=0,
        data_device="cpu",
        progress_bar=False,
        accuracy_calculator=_NoMetrics(),
    )
    return tester.get_all_embeddings(dataset, model)[0]


class _NoMetrics:
    """get_all_embeddings computes no metric; this keeps the run free of the calculator."""

    def get_accuracy(self, *args: object, **kwargs: object) -> dict[str, float]:
        return {}


METHODS = {"loop": _loop, "tester": _tester}


def _measure_here(method: str, n: int, d: int, batch: int) -> dict[str, float]:
    dataset, model = _setup(n, d)
    METHODS[method](TensorDataset(*dataset[:batch]), model, batch)  # warm up
    before = peak_rss_bytes()
    start = time.perf_counter()
    result = METHODS[method](dataset, model, batch)
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    checksum = float(result.double().sum())
    return {"seconds": seconds, "peak_mib": max(peak - before, 0) / 2**20, "checksum": checksum}


def _measure(method: str, n: int, d: int, batch: int) -> dict[str, float] | None:
    command = [sys.executable, __file__, "--one", method, str(n), str(d), str(batch)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,400000")
    parser.add_argument("--dims", default="256")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, n, d, batch = args.one
        print(json.dumps(_measure_here(method, int(n), int(d), int(batch))))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}")
    print(
        f"{'n':>7} {'d':>4} {'method':>7} {'seconds':>8} {'peak MiB':>9} {'output MiB':>10} {'time/loop':>9}"
    )
    for n in map(int, args.sizes.split(",")):
        for d in map(int, args.dims.split(",")):
            _report(n, d, args.batch)


def _report(n: int, d: int, batch: int) -> None:
    results = {method: _measure(method, n, d, batch) for method in METHODS}
    loop = results["loop"]
    output_mib = n * d * 4 / 2**20
    for method, result in results.items():
        if result is None:
            print(f"{n:>7} {d:>4} {method:>7}   failed")
            continue
        ratio = result["seconds"] / loop["seconds"] if loop else float("nan")
        print(
            f"{n:>7} {d:>4} {method:>7} {result['seconds']:>8.3f} {result['peak_mib']:>9.1f} "
            f"{output_mib:>10.1f} {ratio:>9.2f}"
        )
    if loop and results["tester"]:
        difference = abs(loop["checksum"] - results["tester"]["checksum"])
        print(f"{'':>7} {'':>4} checksum difference {difference:.2e}")


if __name__ == "__main__":
    main()
