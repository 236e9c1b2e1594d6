"""FaissKNN's GPU rules, checked without a GPU: pure decisions and a fake GPU build of faiss.

The fake module wraps the real faiss-cpu: its "GPU indices" hold a real CPU index and record
what happens to them, so the searches still return real results.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import faiss
import pytest
import torch
from faiss_test_helpers import brute_force_knn

import pytorch_metric_learning_faiss.knn as knn_module
from pytorch_metric_learning.errors import BackendRuntimeError, InvalidArgumentError
from pytorch_metric_learning_faiss import FaissKNN, _gpu
from pytorch_metric_learning_faiss._gpu import GpuEnvironment

pytestmark = pytest.mark.faiss

CPU, CUDA0, CUDA1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
LOGGER = "pytorch_metric_learning.faiss.knn"


# --- pure decisions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "device", "gpus", "expected"),
    [
        (GpuEnvironment(False, 0), CUDA0, None, ()),  # faiss-cpu: never a GPU
        (GpuEnvironment(False, 0), CPU, (0,), ()),
        (GpuEnvironment(False, 4), CUDA0, (0,), ()),  # even if it reports GPUs
        (GpuEnvironment(True, 0), CUDA0, None, ()),  # GPU build, no visible GPU
        (GpuEnvironment(True, 2), CPU, None, ()),  # CPU query, no gpus: CPU
        (GpuEnvironment(True, 2), CUDA1, None, (0, 1)),  # CUDA query: every visible GPU
        (GpuEnvironment(True, 2), CPU, (1,), (1,)),  # explicit gpus win
        (GpuEnvironment(True, 3), CUDA0, (2, 0), (2, 0)),
    ],
)
def test_plan_gpus(
    env: GpuEnvironment, device: torch.device, gpus: tuple[int, ...] | None, expected: tuple
) -> None:
    assert _gpu.plan_gpus(env, device, gpus) == expected


@pytest.mark.parametrize(
    ("devices", "device", "expected"),
    [
        ((0,), CUDA0, True),
        ((1,), CUDA1, True),
        ((0,), CUDA1, False),  # another GPU: CPU copy
        ((0, 1), CUDA0, False),  # sharded: CPU copy
        ((), CUDA0, False),  # CPU index
        ((0,), CPU, False),
    ],
)
def test_zero_copy(devices: tuple[int, ...], device: torch.device, expected: bool) -> None:
    assert _gpu.zero_copy(devices, device) is expected


def test_k_limit_is_faiss_gpu_max_selection() -> None:
    assert _gpu.GPU_MAX_K == 2048
    assert _gpu.k_fits_gpu(1) and _gpu.k_fits_gpu(2048) and not _gpu.k_fits_gpu(2049)


def test_gpu_build_is_detected_through_gpu_index() -> None:
    class WithGpu:
        GpuIndex = object

        @staticmethod
        def get_num_gpus() -> int:
            return 3

    assert _gpu.gpu_environment(WithGpu) == GpuEnvironment(True, 3)
    assert _gpu.gpu_environment(types.SimpleNamespace(get_num_gpus=lambda: 3)) == GpuEnvironment(
        False, 0
    )
    assert _gpu.gpu_environment(faiss).gpu_build is hasattr(faiss, "GpuIndex")


def test_gpu_resources_are_created_once_per_device() -> None:
    made: list[object] = []

    def factory() -> object:
        made.append(object())
        return made[-1]

    resources = _gpu.GpuResources(factory)
    first = resources.get(0)
    assert resources.get(0) is first and resources.get(1) is not first
    assert len(made) == 2 == len(resources)


def test_torch_stream_sets_and_restores_the_stream() -> None:
    class Resources:
        def __init__(self) -> None:
            self.streams = {0: "faiss-default"}
            self.history: list[tuple[int, object]] = []

        def getDefaultStream(self, device: int) -> object:  # noqa: N802 (faiss's name)
            return self.streams[device]

        def setDefaultStream(self, device: int, stream: object) -> None:  # noqa: N802
            self.history.append((device, stream))
            self.streams[device] = stream

    fake = types.SimpleNamespace(cast_integer_to_cudastream_t=lambda handle: ("stream", handle))
    resources = Resources()
    with pytest.raises(ZeroDivisionError), _gpu.torch_stream(resources, 0, 1234, fake):
        assert resources.streams[0] == ("stream", 1234)
        1 / 0  # noqa: B018 (the stream is restored even on errors)
    assert resources.history == [(0, ("stream", 1234)), (0, "faiss-default")]


# --- a fake GPU build of faiss ------------------------------------------------------------


class FakeGpuIndex:
    """Stands for faiss.GpuIndex: a real CPU index said to live on ``device``."""

    def __init__(self, cpu_index: Any, device: int, log: list[tuple], fail: bool = False) -> None:
        self.cpu_index, self.device, self.log, self.fail = cpu_index, device, log, fail

    def getDevice(self) -> int:  # noqa: N802 (faiss's name)
        return self.device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cpu_index, name)

    def add(self, x: Any) -> None:
        self.log.append(("add", self.device, type(x).__name__))
        self.cpu_index.add(x)

    def search(self, x: Any, k: int) -> Any:
        self.log.append(("search", self.device, type(x).__name__, k))
        if self.fail:
            raise RuntimeError("Error in GpuIndex::search: out of memory")
        return self.cpu_index.search(x, k)


class FakeShards:
    """Stands for a faiss.IndexShards of GPU indices (one real CPU index behind them)."""

    def __init__(self, parts: list[FakeGpuIndex], cpu_index: Any, log: list[tuple]) -> None:
        self.parts, self.cpu_index, self.log = parts, cpu_index, log

    def count(self) -> int:
        return len(self.parts)

    def at(self, i: int) -> FakeGpuIndex:
        return self.parts[i]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cpu_index, name)

    def search(self, x: Any, k: int) -> Any:
        self.log.append(("search", "shards", type(x).__name__, k))
        return self.cpu_index.search(x, k)


class FakeFaiss(types.ModuleType):
    """The real faiss module plus the GPU API of a GPU build with ``num_gpus`` GPUs."""

    GpuIndex = FakeGpuIndex
    IndexShards = FakeShards
    IndexReplicas = type("FakeReplicas", (), {})

    def __init__(self, num_gpus: int, fail_search: bool = False) -> None:
        super().__init__("fake_faiss")
        self.num_gpus, self.fail_search = num_gpus, fail_search
        self.log: list[tuple] = []
        self.resources_made = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(faiss, name)

    def get_num_gpus(self) -> int:
        return self.num_gpus

    def StandardGpuResources(self) -> object:  # noqa: N802 (faiss's name)
        self.resources_made += 1
        return object()

    def downcast_index(self, index: Any) -> Any:
        return index

    def index_cpu_to_gpu(self, resources: object, device: int, index: Any) -> FakeGpuIndex:
        self.log.append(("to_gpu", device))
        return FakeGpuIndex(faiss.clone_index(index), device, self.log, self.fail_search)

    def GpuMultipleClonerOptions(self) -> types.SimpleNamespace:  # noqa: N802
        return types.SimpleNamespace(shard=False)

    def index_cpu_to_gpu_multiple_py(
        self, resources: list, index: Any, options: Any, gpus: list[int]
    ) -> FakeShards:
        assert len(resources) == len(gpus) and len(set(map(id, resources))) == len(gpus)
        self.log.append(("to_gpus", tuple(gpus), options.shard))
        cpu = faiss.clone_index(index)
        return FakeShards([FakeGpuIndex(cpu, g, self.log) for g in gpus], cpu, self.log)

    def index_gpu_to_cpu(self, index: Any) -> Any:
        self.log.append(("to_cpu",))
        return faiss.clone_index(index.cpu_index)


@pytest.fixture
def fake_faiss(monkeypatch: pytest.MonkeyPatch) -> FakeFaiss:
    fake = FakeFaiss(num_gpus=2)
    monkeypatch.setattr(knn_module, "faiss", fake)
    return fake


def _data(seed: int, rows: int, dims: int = 4) -> torch.Tensor:
    return torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))


def test_index_moves_to_the_requested_gpu(fake_faiss: FakeFaiss) -> None:
    query, reference = _data(0, 5), _data(1, 30)
    knn = FaissKNN(gpus=[1], reset_after=False)
    distances, indices = knn(query, 3, reference)
    assert fake_faiss.log[0] == ("to_gpu", 1)
    # CPU tensors reach the GPU index as (float32) CPU copies; the search looks one
    # neighbour past k, to see ties across the k-th place.
    assert ("add", 1, "ndarray") in fake_faiss.log and ("search", 1, "ndarray", 4) in fake_faiss.log
    assert _gpu.index_gpus(knn.index, fake_faiss) == (1,)
    assert torch.equal(indices, brute_force_knn(query, reference, 3)[1])
    assert distances.device == query.device


def test_cpu_queries_without_gpus_stay_on_the_cpu(fake_faiss: FakeFaiss) -> None:
    query, reference = _data(0, 5), _data(1, 30)
    FaissKNN()(query, 3, reference)
    assert fake_faiss.log == [] and fake_faiss.resources_made == 0


def test_gpu_resources_are_reused_across_calls(fake_faiss: FakeFaiss) -> None:
    knn = FaissKNN(gpus=[0])
    for seed in range(4):
        knn(_data(seed, 3), 2, _data(seed + 10, 20))
    assert [entry for entry in fake_faiss.log if entry[0] == "to_gpu"] == [("to_gpu", 0)] * 4
    assert fake_faiss.resources_made == 1


def test_several_gpus_shard_the_index_and_get_cpu_copies(fake_faiss: FakeFaiss) -> None:
    query, reference = _data(0, 5), _data(1, 30)
    knn = FaissKNN(gpus=(0, 1), reset_after=False)
    _, indices = knn(query, 4, reference)
    assert fake_faiss.log[0] == ("to_gpus", (0, 1), True)
    assert ("search", "shards", "ndarray", 5) in fake_faiss.log  # k + 1: ties (see above)
    assert _gpu.index_gpus(knn.index, fake_faiss) == (0, 1)
    assert fake_faiss.resources_made == 2
    assert torch.equal(indices, brute_force_knn(query, reference, 4)[1])


def test_k_beyond_the_gpu_limit_logs_and_builds_a_cpu_index(
    fake_faiss: FakeFaiss, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _data(1, 2100, 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        distances, indices = FaissKNN(gpus=[0])(reference[:2], 2049, reference)
    assert not any(entry[0] == "to_gpu" for entry in fake_faiss.log)
    assert [r.levelno for r in caplog.records if "2049" in r.getMessage()] == [logging.WARNING]
    assert indices.shape == (2, 2049) and indices[:, 0].tolist() == [0, 1]


def test_k_at_the_gpu_limit_searches_on_the_gpu(
    fake_faiss: FakeFaiss, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _data(1, 2100, 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        FaissKNN(gpus=[0])(reference[:2], 2048, reference)
    assert ("search", 0, "ndarray", 2048) in fake_faiss.log and caplog.records == []


def test_a_gpu_index_searches_a_copy_on_the_cpu_for_large_k(
    fake_faiss: FakeFaiss, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _data(1, 2100, 2)
    knn = FaissKNN(reset_before=False, reset_after=False, gpus=[0])
    knn.train(reference)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, indices = knn(reference[:2], 2049)
    assert ("to_cpu",) in fake_faiss.log
    assert not any(entry[0] == "search" and entry[1] == 0 for entry in fake_faiss.log)
    assert len([r for r in caplog.records if "2049" in r.getMessage()]) == 1
    assert _gpu.index_gpus(knn.index, fake_faiss) == (0,)  # the GPU index stays
    assert indices[:, 0].tolist() == [0, 1]


def test_other_gpu_errors_are_raised_not_swallowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeFaiss(num_gpus=1, fail_search=True)
    monkeypatch.setattr(knn_module, "faiss", fake)
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(BackendRuntimeError, match="out of memory") as caught,
    ):
        FaissKNN(gpus=[0])(_data(0, 3), 2, _data(1, 20))
    assert type(caught.value.__cause__) is RuntimeError
    assert ("to_cpu",) not in fake.log and caplog.records == []


def test_gpus_must_be_visible(fake_faiss: FakeFaiss) -> None:
    with pytest.raises(InvalidArgumentError, match=r"visible to faiss \(0 to 1\)"):
        FaissKNN(gpus=[2])(_data(0, 3), 1, _data(1, 10))


def test_save_writes_a_cpu_copy_of_a_gpu_index(fake_faiss: FakeFaiss, tmp_path: Any) -> None:
    reference = _data(1, 40)
    knn = FaissKNN(reset_before=False, reset_after=False, gpus=[0])
    knn.train(reference)
    knn.save(str(tmp_path / "gpu.index"))
    assert ("to_cpu",) in fake_faiss.log
    assert faiss.read_index(str(tmp_path / "gpu.index")).ntotal == 40


def test_same_device_inputs_take_the_zero_copy_path(
    fake_faiss: FakeFaiss, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend the CPU tensors sit on the index's GPU, and record the in-place calls.
    calls: list[tuple] = []

    def add_on_device(index: Any, x: torch.Tensor, resources: object, module: Any) -> None:
        calls.append(("add", index.getDevice(), resources, module))
        index.cpu_index.add(x.numpy())

    def search_on_device(
        index: Any, query: torch.Tensor, k: int, resources: object, module: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(("search", index.getDevice(), resources, module))
        found = index.cpu_index.search(query.numpy(), k)
        return torch.from_numpy(found[0]), torch.from_numpy(found[1])

    monkeypatch.setattr(_gpu, "zero_copy", lambda devices, device: devices == (1,))
    monkeypatch.setattr(_gpu, "add_on_device", add_on_device)
    monkeypatch.setattr(_gpu, "search_on_device", search_on_device)
    query, reference = _data(0, 4), _data(1, 25)
    knn = FaissKNN(gpus=[1])
    _, indices = knn(query, 3, reference)
    resources = knn._resources.get(1)
    assert calls == [("add", 1, resources, fake_faiss), ("search", 1, resources, fake_faiss)]
    assert not any(entry[0] in ("add", "search") for entry in fake_faiss.log)
    assert torch.equal(indices, brute_force_knn(query, reference, 3)[1])
