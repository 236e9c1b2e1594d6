"""Shared pieces of the testers' tests: a spy accuracy calculator, tiny datasets, a model."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.testers import (
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
    WithSameParentLabelTester,
)

# Every tester class, for tests that hold for all of them.
TESTERS = (
    GlobalEmbeddingSpaceTester,
    WithSameParentLabelTester,
    GlobalTwoStreamEmbeddingSpaceTester,
)

FIXED_METRICS = {"precision_at_1": 0.5, "r_precision": 0.25}
_GET_ACCURACY = inspect.signature(AccuracyCalculator.get_accuracy)
_RECORDED = ("query", "query_labels", "reference", "reference_labels", "ref_includes_query")


class SpyCalculator:
    """Records every get_accuracy call and returns fixed metrics."""

    def __init__(self, metrics: dict[str, Any] | None = None) -> None:
        self.metrics = dict(FIXED_METRICS if metrics is None else metrics)
        self.calls: list[dict[str, Any]] = []

    def get_accuracy(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Takes AccuracyCalculator.get_accuracy's arguments (bound to its signature)."""
        given = _GET_ACCURACY.bind(None, *args, **kwargs)
        given.apply_defaults()
        call = {name: given.arguments[name] for name in _RECORDED}
        self.calls.append({k: v.clone() if torch.is_tensor(v) else v for k, v in call.items()})
        return dict(self.metrics)


class CountingDataset(Dataset):
    """A (data, label) dataset that counts how often each item is read."""

    def __init__(self, data: torch.Tensor, labels: torch.Tensor) -> None:
        self.data, self.labels = data, labels
        self.reads = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.data[index], self.labels[index]


def make_split(num: int, dims: int = 5, num_classes: int = 3, seed: int = 0) -> TensorDataset:
    """Random features and integer labels."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(num, dims, generator=generator)
    labels = torch.randint(0, num_classes, (num,), generator=generator)
    return TensorDataset(data, labels)


def make_model(dims_in: int = 5, dims_out: int = 4, seed: int = 0) -> torch.nn.Linear:
    """A fixed-seed linear model."""
    torch.manual_seed(seed)
    return torch.nn.Linear(dims_in, dims_out)


def embed_by_hand(
    model: torch.nn.Module, data: torch.Tensor, normalize: bool = True
) -> torch.Tensor:
    with torch.no_grad():
        out = model(data)
    return torch.nn.functional.normalize(out, dim=1) if normalize else out


def quiet(**options: Any) -> dict[str, Any]:
    """Options for fast, silent tests: no worker processes, no progress bar, CPU."""
    return {"dataloader_num_workers": 0, "progress_bar": False, "data_device": "cpu", **options}
