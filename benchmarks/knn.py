"""Exact k-NN speed and memory: CustomKNN against its compute floor and the usual alternatives.

Each measurement runs in a fresh subprocess, so its peak resident memory is its own; with
--repeats R each runs R times and the fastest counts (the machine may be shared). CPU
seconds (user + system) are reported beside wall seconds: with --threads 1 they are the
steadier measure when other processes share the cores.
Methods, measured in the same run on the same data:
  gemm       every product of the full n x n matrix, in 2048-square tiles: the GEMM floor
  gemm_blocks  the same products in 512 x 1024 blocks, which on some machines cost less
  custom     CustomKNN default (memory-budget tiles), self-search: knn(x, k, None, True)
  custom_sep CustomKNN default, a separate reference (a copy of x): knn(x, k, copy)
  custom_torch / custom_torch_sep  the same with the compiled top-k off (PML_DISABLE_NUMBA=1):
             the PyTorch-only paths, as on a machine without numba
  custom256  CustomKNN(batch_size=256), self-search: the previous default
  cdist      torch.cdist + torch.topk on 256-row blocks
  faiss      faiss.IndexFlatL2, self-search (when faiss is importable)
  faissknn   FaissKNN from the plugin (when it is installed)

Usage: python benchmarks/knn.py [--sizes 10000,50000] [--dims 128] [--ks 1,100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from _memory import peak_rss_bytes

BATCH = 256
TILE = 2048
BLOCKS = (512, 1024)


def _data(n: int, d: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=generator)


def _gemm(x: torch.Tensor, k: int) -> None:
    _products(x, TILE, TILE)


def _gemm_blocks(x: torch.Tensor, k: int) -> None:
    _products(x, *BLOCKS)


def _products(x: torch.Tensor, height: int, width: int) -> None:
    """Every product of the n x n matrix, in blocks of ``height`` rows and ``width`` columns."""
    out = torch.empty(height * width)
    for r0 in range(0, len(x), height):
        rows = x[r0 : r0 + height]
        for c0 in range(0, len(x), width):
            cols = x[c0 : c0 + width]
            torch.mm(rows, cols.T, out=out[: len(rows) * len(cols)].view(len(rows), len(cols)))


def _cdist(x: torch.Tensor, k: int) -> None:
    for start in range(0, len(x), BATCH):
        torch.topk(torch.cdist(x[start : start + BATCH], x), k + 1, dim=1, largest=False)


def _knn(batch_size: int | None) -> Any:
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN

    return CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=batch_size)


def _custom(x: torch.Tensor, k: int) -> None:
    _knn(None)(x, k, None, True)


def _custom_sep(x: torch.Tensor, k: int) -> None:
    _knn(None)(x, k, x.clone())


def _custom_torch(x: torch.Tensor, k: int) -> None:
    with _compiled_off():
        _custom(x, k)


def _custom_torch_sep(x: torch.Tensor, k: int) -> None:
    with _compiled_off():
        _custom_sep(x, k)


@contextlib.contextmanager
def _compiled_off() -> Iterator[None]:
    from pytorch_metric_learning.evaluation.search._compiled_topk import DISABLE_ENV

    os.environ[DISABLE_ENV] = "1"
    try:
        yield
    finally:
        del os.environ[DISABLE_ENV]


def _custom256(x: torch.Tensor, k: int) -> None:
    _knn(BATCH)(x, k, None, True)


def _faiss(x: torch.Tensor, k: int) -> None:
    import faiss

    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x.numpy())
    index.search(x.numpy(), k + 1)


def _faissknn(x: torch.Tensor, k: int) -> None:
    from pytorch_metric_learning.evaluation import load_knn_func

    load_knn_func("faiss")(x, k, x, True)


METHODS = {
    "gemm": _gemm,
    "gemm_blocks": _gemm_blocks,
    "custom": _custom,
    "custom_sep": _custom_sep,
    "custom_torch": _custom_torch,
    "custom_torch_sep": _custom_torch_sep,
    "custom256": _custom256,
    "cdist": _cdist,
    "faiss": _faiss,
    "faissknn": _faissknn,
}


def _load_compiled() -> None:
    """Load the compiled top-k once (about 0.5 s; a few seconds on first use, then cached),
    as a process that searches every epoch does; the warm-up search is too small for it."""
    from pytorch_metric_learning.evaluation.search import _compiled_topk

    if _compiled_topk.available():
        state = _compiled_topk.CompiledTopK(4, 1)
        state.push_rows(0, torch.zeros(4, 4), 0)
        state.push_columns(0, torch.zeros(4, 4), 0)
        state.kth_smallest(torch.zeros(4, 4), 1)
        state.finish()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure_here(method: str, n: int, d: int, k: int) -> dict[str, float]:
    x = _data(n, d)
    METHODS[method](x[:BATCH], min(k, BATCH - 1))  # warm up imports and thread pools
    if method.startswith("custom"):
        _load_compiled()
    before = peak_rss_bytes()
    cpu, start = _cpu_seconds(), time.perf_counter()
    METHODS[method](x, k)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    peak = peak_rss_bytes()
    return {"seconds": seconds, "cpu": cpu, "peak_mib": max(peak - before, 0) / 2**20}


def _set_threads(threads: int) -> None:
    if threads <= 0:
        return
    torch.set_num_threads(threads)
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(threads)


def _measure(
    method: str, n: int, d: int, k: int, repeats: int, threads: int
) -> dict[str, float] | None:
    """The fastest wall and CPU times of ``repeats`` fresh-process runs, the largest peak."""
    command = [sys.executable, __file__, "--one", method, str(n), str(d), str(k), str(threads)]
    runs = []
    for _ in range(repeats):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            return None
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return {
        "seconds": min(run["seconds"] for run in runs),
        "cpu": min(run["cpu"] for run in runs),
        "peak_mib": max(run["peak_mib"] for run in runs),
    }


def _available(method: str) -> bool:
    probe = {"faiss": "import faiss", "faissknn": "import pytorch_metric_learning_faiss"}
    if method not in probe:
        return True
    return (
        subprocess.run([sys.executable, "-c", probe[method]], capture_output=True).returncode == 0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--dims", default="128")
    parser.add_argument("--ks", default="1,100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=0, help="torch/faiss threads (0: default)")
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, n, d, k, threads = args.one
        _set_threads(int(threads))
        print(json.dumps(_measure_here(method, int(n), int(d), int(k))))
        return
    methods = [m for m in args.methods.split(",") if m in METHODS and _available(m)]
    _set_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"best of {args.repeats} runs each"
    )
    print(
        f"{'n':>7} {'d':>4} {'k':>4} {'method':>16} {'seconds':>8} {'cpu s':>8} {'peak MiB':>9} "
        f"{'x/gemm':>7} {'cpu x/gemm':>10} {'custom/x':>9}"
    )
    for n in map(int, args.sizes.split(",")):
        for d in map(int, args.dims.split(",")):
            for k in map(int, args.ks.split(",")):
                _report(methods, (n, d, k), args.repeats, args.threads)


def _report(methods: list[str], size: tuple[int, int, int], repeats: int, threads: int) -> None:
    n, d, k = size
    results = {m: _measure(m, n, d, k, repeats, threads) for m in methods}
    custom, gemm = results.get("custom"), results.get("gemm")
    for method, result in results.items():
        if result is None:
            print(f"{n:>7} {d:>4} {k:>4} {method:>16}   failed")
            continue
        seconds, cpu = result["seconds"], result["cpu"]
        floor = seconds / gemm["seconds"] if gemm else float("nan")
        cpu_floor = cpu / gemm["cpu"] if gemm else float("nan")
        ratio = custom["seconds"] / seconds if custom else float("nan")
        print(
            f"{n:>7} {d:>4} {k:>4} {method:>16} {seconds:>8.3f} {cpu:>8.3f} "
            f"{result['peak_mib']:>9.1f} {floor:>7.2f} {cpu_floor:>10.2f} {ratio:>9.2f}"
        )


if __name__ == "__main__":
    main()
