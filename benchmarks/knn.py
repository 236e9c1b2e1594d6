"""Exact k-NN speed and memory: CustomKNN against its compute floor and the usual alternatives.

Each measurement runs in a fresh subprocess, so its peak resident memory is its own.
Baselines, measured in the same run on the same data (self-retrieval):
  gemm     the bare matrix products of the same (batch, n) blocks: the compute floor
  cdist    torch.cdist + torch.topk on the same blocks
  faiss    faiss.IndexFlatL2 (when faiss is importable)
  faissknn FaissKNN from the plugin (when it is installed)

Usage: python benchmarks/knn.py [--sizes 10000,50000] [--dims 128,512] [--ks 1,100]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

BATCH = 256


def _data(n: int, d: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=generator)


def _gemm(x: torch.Tensor, k: int) -> None:
    out = torch.empty(BATCH, len(x))
    for start in range(0, len(x), BATCH):
        block = x[start : start + BATCH]
        torch.mm(block, x.T, out=out[: len(block)])


def _cdist(x: torch.Tensor, k: int) -> None:
    for start in range(0, len(x), BATCH):
        torch.topk(torch.cdist(x[start : start + BATCH], x), k + 1, dim=1, largest=False)


def _custom(x: torch.Tensor, k: int) -> None:
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN

    CustomKNN(LpDistance(normalize_embeddings=False, power=2), batch_size=BATCH)(x, k, x, True)


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
    "cdist": _cdist,
    "custom": _custom,
    "faiss": _faiss,
    "faissknn": _faissknn,
}


def _measure_here(method: str, n: int, d: int, k: int) -> dict[str, float]:
    x = _data(n, d)
    METHODS[method](x[:BATCH], min(k, BATCH - 1))  # warm up imports and thread pools
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    METHODS[method](x, k)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": max(peak - before, 0) / 1024}


def _measure(method: str, n: int, d: int, k: int) -> dict[str, float] | None:
    command = [sys.executable, __file__, "--one", method, str(n), str(d), str(k)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--dims", default="128,512")
    parser.add_argument("--ks", default="1,100")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, n, d, k = args.one
        print(json.dumps(_measure_here(method, int(n), int(d), int(k))))
        return
    methods = [m for m in METHODS if _available(m)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}")
    header = (
        f"{'n':>7} {'d':>4} {'k':>4} {'method':>9} {'seconds':>8} {'peak MiB':>9} {'custom/x':>9}"
    )
    print(header)
    for n in map(int, args.sizes.split(",")):
        for d in map(int, args.dims.split(",")):
            for k in map(int, args.ks.split(",")):
                _report(methods, n, d, k)


def _report(methods: list[str], n: int, d: int, k: int) -> None:
    results = {m: _measure(m, n, d, k) for m in methods}
    custom = results.get("custom")
    for method, result in results.items():
        if result is None:
            print(f"{n:>7} {d:>4} {k:>4} {method:>9}   failed")
            continue
        ratio = custom["seconds"] / result["seconds"] if custom else float("nan")
        print(
            f"{n:>7} {d:>4} {k:>4} {method:>9} {result['seconds']:>8.3f} "
            f"{result['peak_mib']:>9.1f} {ratio:>9.2f}"
        )


if __name__ == "__main__":
    main()
