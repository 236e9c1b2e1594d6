"""GPU readiness in one run: CUDA results equal to CPU, times against faiss-gpu and 2.9.0.

Nothing is installed by this script. On a CUDA machine, beforehand (a CUDA build of torch,
the faiss GPU wheel in place of faiss-cpu, and 2.9.0 in a virtualenv of its own):

    pip install torch -e . && pip install --no-deps -e plugins/faiss
    pip uninstall -y faiss-cpu && pip install "faiss-gpu-cu12==1.14.1.post1"
    python -m venv /tmp/pml29 && /tmp/pml29/bin/pip install torch \\
        "pytorch-metric-learning==2.9.0" "faiss-gpu-cu12==1.14.1.post1"
    python benchmarks/gpu_check.py --pml29-python /tmp/pml29/bin/python

It reports, each line OK, FAIL or SKIP:
  custom_knn     CustomKNN self-search on CUDA equal to CPU; time against faiss GpuIndexFlatL2
  accuracy       AccuracyCalculator() on CUDA equal to CPU (k-NN metrics)
  pml29          2.9.0's AccuracyCalculator(k="max_bin_count", device=cuda) with faiss-gpu
  faiss_rules    FaissKNN: one GPU index on the query's device, results there; k > 2048
                 falls back to the CPU index with a warning; gpus=[0] searches on GPU 0
  nccl           DistributedKNN in a one-rank NCCL group equal to CustomKNN
Defaults (n = 50,000, d = 128, k = 100) run in a few minutes on one GPU. Without CUDA it
says so and exits with status 0; ``--dry-run`` runs the same checks on the CPU with
small sizes (gloo instead of NCCL), which the test suite does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch


class Check(NamedTuple):
    name: str
    status: str  # OK, FAIL or SKIP
    detail: str


class Setup(NamedTuple):
    device: torch.device
    n: int
    dim: int
    k: int
    pml29_python: str | None
    backend: str  # the torch.distributed backend: nccl, or gloo for --dry-run


def make_data(n: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian classes of about 50 points each, as benchmarks/accuracy.py makes them."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, max(1, n // 50), n)
    centers = rng.standard_normal((labels.max() + 1, dim)).astype(np.float32)
    x = centers[labels] + 1.4 * rng.standard_normal((n, dim)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(labels)


def timed(function: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """Result and seconds of one call, synchronizing CUDA before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def same_neighbours(
    first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]
) -> tuple[bool, str]:
    """Distances close and indices equal but where float rounding reorders near-ties."""
    d1, i1 = (t.cpu() for t in first)
    d2, i2 = (t.cpu() for t in second)
    agree = float((i1 == i2).float().mean())
    gap = float((d1.double() - d2.double()).abs().max()) if d1.numel() else 0.0
    scale = float(d1.abs().max()) if d1.numel() else 1.0
    ok = agree >= 0.999 and gap <= 1e-4 * max(scale, 1.0)
    return ok, f"indices equal {agree:.4%}, max |distance diff| {gap:.2e}"


def check_custom_knn(setup: Setup) -> Check:
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN

    x, _ = make_data(setup.n, setup.dim)
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    cpu, cpu_s = timed(lambda: knn(x, setup.k, None, True), torch.device("cpu"))
    on_device = x.to(setup.device)
    knn(on_device[:256], 1)  # warm-up: CUDA context and kernels
    found, seconds = timed(lambda: knn(on_device, setup.k, None, True), setup.device)
    ok, detail = same_neighbours(cpu, found)
    faiss_s = _faiss_gpu_flat_seconds(x, setup)
    versus = f", faiss GpuIndexFlatL2 {faiss_s:.3f} s" if faiss_s is not None else ""
    times = f"; {setup.device} {seconds:.3f} s, cpu {cpu_s:.3f} s{versus}"
    return Check("custom_knn", "OK" if ok else "FAIL", detail + times)


def _faiss_gpu_flat_seconds(x: torch.Tensor, setup: Setup) -> float | None:
    faiss = _faiss_gpu()
    if faiss is None or setup.device.type != "cuda":
        return None
    resources = faiss.StandardGpuResources()
    index = faiss.GpuIndexFlatL2(resources, x.shape[1])
    data = x.numpy()
    index.add(data)
    index.search(data[:256], 1)  # warm-up
    _, seconds = timed(lambda: index.search(data, setup.k + 1), setup.device)
    return seconds


def _faiss_gpu() -> Any:
    try:
        import faiss
    except ImportError:
        return None
    has_gpu = hasattr(faiss, "GpuIndex") and faiss.get_num_gpus() > 0
    return faiss if has_gpu else None


KNN_KEYS = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
)


def check_accuracy(setup: Setup) -> Check:
    from pytorch_metric_learning.evaluation import AccuracyCalculator

    x, labels = make_data(setup.n, setup.dim)
    cpu, cpu_s = timed(lambda: AccuracyCalculator().get_accuracy(x, labels), torch.device("cpu"))
    calculator = AccuracyCalculator(device=setup.device)
    found, seconds = timed(lambda: calculator.get_accuracy(x, labels), setup.device)
    gap = max(abs(cpu[key] - found[key]) for key in KNN_KEYS)
    clusters = max(abs(cpu[key] - found[key]) for key in ("NMI", "AMI"))
    detail = (
        f"max |k-NN metric diff| {gap:.2e}, NMI/AMI diff {clusters:.2e} (k-means on each "
        f"device); {setup.device} {seconds:.3f} s, cpu {cpu_s:.3f} s"
    )
    return Check("accuracy", "OK" if gap <= 1e-3 else "FAIL", detail)


def check_pml29(setup: Setup) -> Check:
    if setup.pml29_python is None:
        return Check("pml29", "SKIP", "no --pml29-python given")
    with tempfile.TemporaryDirectory() as directory:
        x, labels = make_data(setup.n, setup.dim)
        np.save(os.path.join(directory, "x.npy"), x.numpy())
        np.save(os.path.join(directory, "labels.npy"), labels.numpy())
        command = [setup.pml29_python, os.path.abspath(__file__), "--worker", directory]
        command += ["--device", str(setup.device)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return Check("pml29", "FAIL", (done.stderr.strip().splitlines() or ["failed"])[-1])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Check("pml29", "OK", f"2.9.0 on {setup.device}: {result['seconds']:.3f} s")


def pml29_worker(directory: str, device: str) -> None:
    """Run in 2.9.0's virtualenv: one AccuracyCalculator evaluation, a JSON line out."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    x = torch.from_numpy(np.load(os.path.join(directory, "x.npy")))
    labels = torch.from_numpy(np.load(os.path.join(directory, "labels.npy")))
    calculator = AccuracyCalculator(k="max_bin_count", device=torch.device(device))
    results, seconds = timed(lambda: calculator.get_accuracy(x, labels), torch.device(device))
    print(json.dumps({"seconds": seconds, "metrics": {k: float(v) for k, v in results.items()}}))


def check_faiss_rules(setup: Setup) -> Check:
    faiss = _faiss_gpu()
    if faiss is None or setup.device.type != "cuda":
        return Check("faiss_rules", "SKIP", "needs a faiss GPU build and a CUDA device")
    from pytorch_metric_learning_faiss import FaissKNN
    from pytorch_metric_learning_faiss._gpu import index_gpus

    x, _ = make_data(4000, setup.dim)
    query, reference = x[:500].to(setup.device), x.to(setup.device)
    cpu = FaissKNN()(x[:500], 10, x)
    knn = FaissKNN(reset_after=False)
    found = knn(query, 10, reference)
    problems = []
    if index_gpus(knn.faiss_index, faiss) != (setup.device.index or 0,):
        problems.append("the index is not one GPU index on the query's device")
    if found[1].device != query.device or not same_neighbours(cpu, found)[0]:
        problems.append("GPU results differ from CPU or left the query's device")
    problems += _fallback_problems(query, reference, x)
    on_gpu = FaissKNN(gpus=[0], reset_after=False)
    cpu_query = on_gpu(x[:500], 10, x)
    if index_gpus(on_gpu.faiss_index, faiss) != (0,) or cpu_query[1].device.type != "cpu":
        problems.append("gpus=[0] did not search on GPU 0 with results on the CPU")
    return Check("faiss_rules", "FAIL" if problems else "OK", "; ".join(problems) or "all hold")


class _Records(logging.Handler):
    """Keeps the log records it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _fallback_problems(query: torch.Tensor, reference: torch.Tensor, x: torch.Tensor) -> list:
    from pytorch_metric_learning_faiss import FaissKNN

    handler = _Records()
    logging.getLogger("pytorch_metric_learning_faiss").addHandler(handler)
    try:
        found = FaissKNN()(query[:20], 2049, reference)
    finally:
        logging.getLogger("pytorch_metric_learning_faiss").removeHandler(handler)
    problems = []
    if not any("2048" in record.getMessage() for record in handler.records):
        problems.append("k=2049 logged no fallback warning")
    if not same_neighbours(FaissKNN()(x[:20], 2049, x), found)[0]:
        problems.append("k=2049 on the CPU fallback differs from the CPU index")
    return problems


def check_distributed(setup: Setup) -> Check:
    import torch.distributed as dist

    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN
    from pytorch_metric_learning.evaluation.distributed import DistributedKNN

    if setup.backend == "nccl" and not dist.is_nccl_available():
        return Check("nccl", "SKIP", "this torch build has no NCCL")
    x, _ = make_data(min(setup.n, 20_000), setup.dim)
    x = x.to(setup.device)
    with tempfile.TemporaryDirectory() as directory:
        init = f"file://{os.path.join(directory, 'init')}"
        dist.init_process_group(setup.backend, init_method=init, rank=0, world_size=1)
        try:
            found = DistributedKNN(block_size=4096)(x, setup.k, x, True)
        finally:
            dist.destroy_process_group()
    expected = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, setup.k, x, True)
    ok, detail = same_neighbours(expected, found)
    return Check(setup.backend, "OK" if ok else "FAIL", f"one rank: {detail}")


CHECKS = (check_custom_knn, check_accuracy, check_pml29, check_faiss_rules, check_distributed)


def run_checks(setup: Setup) -> list[Check]:
    """Every check in turn; one that raises is a FAIL, and the others still run."""
    results = []
    for check in CHECKS:
        start = time.perf_counter()
        try:
            result = check(setup)
        except Exception as error:  # report and go on: one broken check must not hide others
            name = check.__name__.removeprefix("check_")
            result = Check(name, "FAIL", f"{type(error).__name__}: {error}")
        print(
            f"{result.status:<4} {result.name:<12} {result.detail} [{time.perf_counter() - start:.1f} s]"
        )
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--pml29-python", help="python of a virtualenv with 2.9.0")
    parser.add_argument("--dry-run", action="store_true", help="run the checks on the CPU")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        pml29_worker(args.worker, args.device)
        return 0
    if args.dry_run:
        size = (min(args.n, 2000), args.dim, min(args.k, 20))
        setup = Setup(torch.device("cpu"), *size, args.pml29_python, "gloo")
    elif not torch.cuda.is_available():
        print("CUDA is not available (torch.cuda.is_available() is False): no GPU check ran.")
        return 0
    else:
        device = torch.device(args.device)
        setup = Setup(device, args.n, args.dim, args.k, args.pml29_python, "nccl")
    print(f"torch {torch.__version__} on {setup.device}, n={setup.n}, d={setup.dim}, k={setup.k}")
    results = run_checks(setup)
    return 1 if any(result.status == "FAIL" for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
