"""Where a faiss search runs: FaissKNN's GPU rules as small functions of plain values.

The decisions (which GPUs, whether an input may stay on its GPU, whether ``k`` fits a GPU
search) take plain values so they can be tested without a GPU; the few functions that act
take the ``faiss`` module as an argument so tests can hand them a fake one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = [
    "GPU_MAX_K",
    "GpuEnvironment",
    "GpuResources",
    "add_on_device",
    "gpu_environment",
    "index_gpus",
    "index_to_gpus",
    "k_fits_gpu",
    "plan_gpus",
    "search_on_device",
    "torch_stream",
    "zero_copy",
]

# The largest k a faiss GPU search accepts (GPU_MAX_SELECTION_K in faiss/gpu/utils/DeviceDefs.cuh).
GPU_MAX_K = 2048


@dataclass(frozen=True)
class GpuEnvironment:
    """What the installed faiss can do on GPUs.

    Attributes:
        gpu_build: Whether faiss was built with GPU support (it provides ``faiss.GpuIndex``).
        num_gpus: GPUs visible to faiss (0 for faiss-cpu, whatever it reports).
    """

    gpu_build: bool
    num_gpus: int


def gpu_environment(faiss_module: Any) -> GpuEnvironment:
    """Detect a GPU build through ``faiss.GpuIndex``; faiss-cpu never counts GPUs.

    Example:
        >>> import types
        >>> gpu_environment(types.SimpleNamespace(get_num_gpus=lambda: 2))
        GpuEnvironment(gpu_build=False, num_gpus=0)
    """
    if not hasattr(faiss_module, "GpuIndex"):
        return GpuEnvironment(gpu_build=False, num_gpus=0)
    return GpuEnvironment(gpu_build=True, num_gpus=int(faiss_module.get_num_gpus()))


def plan_gpus(
    env: GpuEnvironment, device: torch.device, gpus: tuple[int, ...] | None
) -> tuple[int, ...]:
    """The GPUs an index should live on for data on ``device``; ``()`` means the CPU.

    A GPU search needs a GPU build with a visible GPU, and a CUDA input or explicit ``gpus``.
    CUDA inputs without ``gpus`` use every GPU visible to faiss.

    Example:
        >>> env = GpuEnvironment(gpu_build=True, num_gpus=2)
        >>> plan_gpus(env, torch.device("cuda", 1), None), plan_gpus(env, torch.device("cpu"), None)
        ((0, 1), ())
    """
    if not env.gpu_build or env.num_gpus == 0:
        return ()
    if gpus is not None:
        return gpus
    if device.type == "cuda":
        return tuple(range(env.num_gpus))
    return ()


def k_fits_gpu(k: int) -> bool:
    """Whether a faiss GPU search accepts ``k`` neighbours.

    Example:
        >>> k_fits_gpu(2048), k_fits_gpu(2049)
        (True, False)
    """
    return k <= GPU_MAX_K


def zero_copy(index_devices: tuple[int, ...], device: torch.device) -> bool:
    """Whether data on ``device`` can go to the index without a CPU copy.

    Only an index that is one GPU index on that same device reads the data in place; a
    CPU index and a sharded multi-GPU index get a CPU copy.

    Example:
        >>> zero_copy((0,), torch.device("cuda", 0)), zero_copy((0, 1), torch.device("cuda", 0))
        (True, False)
    """
    return len(index_devices) == 1 and device.type == "cuda" and device.index == index_devices[0]


def index_gpus(index: Any, faiss_module: Any) -> tuple[int, ...]:
    """The GPUs ``index`` lives on: ``()`` for a CPU index, several for a sharded one.

    Example:
        >>> import types
        >>> index_gpus(object(), types.SimpleNamespace())
        ()
    """
    gpu_index = getattr(faiss_module, "GpuIndex", None)
    if gpu_index is None:
        return ()
    if isinstance(index, gpu_index):
        return (int(index.getDevice()),)
    if isinstance(index, (faiss_module.IndexShards, faiss_module.IndexReplicas)):
        parts = (faiss_module.downcast_index(index.at(i)) for i in range(index.count()))
        return tuple(device for part in parts for device in index_gpus(part, faiss_module))
    return ()


class GpuResources:
    """One faiss GPU resources object per GPU, created on first use and reused after.

    Creating resources on every call exhausts GPU memory over a training run, so a
    FaissKNN keeps one of these for its lifetime.

    Example:
        >>> resources = GpuResources(object)
        >>> resources.get(0) is resources.get(0)
        True
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._by_device: dict[int, Any] = {}

    def get(self, device: int) -> Any:
        """The resources of GPU ``device``."""
        if device not in self._by_device:
            self._by_device[device] = self._factory()
        return self._by_device[device]

    def __len__(self) -> int:
        return len(self._by_device)


def index_to_gpus(
    index: Any, gpus: tuple[int, ...], resources: GpuResources, faiss_module: Any
) -> Any:
    """Copy a CPU index to one GPU, or shard it over several."""
    if len(gpus) == 1:
        return faiss_module.index_cpu_to_gpu(resources.get(gpus[0]), gpus[0], index)
    options = faiss_module.GpuMultipleClonerOptions()
    options.shard = True
    return faiss_module.index_cpu_to_gpu_multiple_py(
        [resources.get(gpu) for gpu in gpus], index, options, list(gpus)
    )


@contextmanager
def torch_stream(
    resources: Any, device: int, stream_handle: int, faiss_module: Any
) -> Iterator[None]:
    """Make faiss work on the given CUDA stream of ``device``, restoring its stream after."""
    previous = resources.getDefaultStream(device)
    resources.setDefaultStream(device, faiss_module.cast_integer_to_cudastream_t(stream_handle))
    try:
        yield
    finally:
        resources.setDefaultStream(device, previous)


@contextmanager
def _device_context(device: torch.device, resources: Any, faiss_module: Any) -> Iterator[None]:
    stream = torch.cuda.current_stream(device)
    with (
        torch.cuda.device(device),
        torch_stream(resources, int(device.index), stream.cuda_stream, faiss_module),
    ):
        yield


def search_on_device(
    index: Any, query: torch.Tensor, k: int, resources: Any, faiss_module: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Search a one-GPU index with a query on that GPU, on PyTorch's current stream."""
    query = query.detach().to(torch.float32).contiguous()
    distances = torch.empty((len(query), k), dtype=torch.float32, device=query.device)
    labels = torch.empty((len(query), k), dtype=torch.int64, device=query.device)
    with _device_context(query.device, resources, faiss_module):
        index.search_c(
            len(query),
            faiss_module.cast_integer_to_float_ptr(query.data_ptr()),
            k,
            faiss_module.cast_integer_to_float_ptr(distances.data_ptr()),
            faiss_module.cast_integer_to_idx_t_ptr(labels.data_ptr()),
        )
    return distances, labels


def add_on_device(index: Any, x: torch.Tensor, resources: Any, faiss_module: Any) -> None:
    """Train (if needed) and fill a one-GPU index with rows already on that GPU."""
    x = x.detach().to(torch.float32).contiguous()
    pointer = faiss_module.cast_integer_to_float_ptr(x.data_ptr())
    with _device_context(x.device, resources, faiss_module):
        if not index.is_trained:
            index.train_c(len(x), pointer)
        index.add_c(len(x), pointer)
