"""2.x trainer options: freeze_these, freeze_trunk_batchnorm, set_min_label_to_zero and
dataset_labels, checked by what must (not) change during training."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.trainers import MetricLossOnly


class _CountingSGD(torch.optim.SGD):
    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1, momentum=0.9, weight_decay=0.1)
        self.steps = 0

    def step(self, closure: Any = None) -> Any:
        self.steps += 1
        return super().step(closure)


def _spread(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
    return -torch.pdist(embeddings).mean()


def _dataset(rows: int = 16, labels: torch.Tensor | None = None) -> TensorDataset:
    x = torch.randn(rows, 6, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, torch.arange(rows) % 4 if labels is None else labels)


def _trainer(models: dict[str, Any], dataset: TensorDataset, **kwargs: Any) -> MetricLossOnly:
    options: dict[str, Any] = {
        "optimizers": {
            f"{name}_optimizer": _CountingSGD(m.parameters()) for name, m in models.items()
        },
        "batch_size": 4,
        "loss_funcs": {"metric_loss": _spread},
        "mining_funcs": {},
        "dataset": dataset,
        "sampler": SequentialSampler(dataset),
        "dataloader_num_workers": 0,
    }
    options.update(kwargs)
    return MetricLossOnly(models=models, **options)


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _same(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, before[name]) for name, value in module.state_dict().items())


def _trunk_with_batchnorm() -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU())


# --- freeze_these --------------------------------------------------------------------------


def test_freeze_these_keeps_the_trunk_as_it_was() -> None:
    trunk, embedder = _trunk_with_batchnorm(), torch.nn.Linear(5, 3)
    trunk_before, embedder_before = _snapshot(trunk), _snapshot(embedder)
    modes = []
    trainer = _trainer(
        {"trunk": trunk, "embedder": embedder},
        _dataset(),
        freeze_these=("trunk",),
        end_of_iteration_hook=lambda t: modes.append((trunk.training, embedder.training)),
    )
    trainer.train(num_epochs=2)

    assert _same(trunk, trunk_before)  # weights and batch-norm statistics
    assert not _same(embedder, embedder_before)
    assert trainer.optimizers["trunk_optimizer"].steps == 0
    assert trainer.optimizers["embedder_optimizer"].steps == 8
    assert set(modes) == {(False, True)}
    assert not any(p.requires_grad for p in trunk.parameters())


def test_freezing_the_embedder_still_trains_the_trunk() -> None:
    trunk, embedder = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)
    trunk_before, embedder_before = _snapshot(trunk), _snapshot(embedder)
    _trainer({"trunk": trunk, "embedder": embedder}, _dataset(), freeze_these=["embedder"]).train()
    assert _same(embedder, embedder_before) and not _same(trunk, trunk_before)


def test_freezing_a_model_that_has_an_optimizer_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        _trainer({"trunk": torch.nn.Linear(6, 3)}, _dataset(), freeze_these=("trunk",))
    assert "optimizer for trunk, but are freezing its parameters" in caplog.text


def test_freeze_these_names_must_be_models_or_losses() -> None:
    with pytest.raises(InvalidArgumentError, match="'freeze_these' parameter of MetricLossOnly"):
        _trainer({"trunk": torch.nn.Linear(6, 3)}, _dataset(), freeze_these=("trunk_model",))
    with pytest.raises(InvalidTypeError, match="'freeze_these' parameter"):
        _trainer({"trunk": torch.nn.Linear(6, 3)}, _dataset(), freeze_these="trunk")


# --- freeze_trunk_batchnorm -----------------------------------------------------------------


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_trunk_batchnorm_keeps_the_running_statistics(freeze: bool) -> None:
    trunk = _trunk_with_batchnorm()
    batchnorm, linear = trunk[1], trunk[0]
    stats_before = _snapshot(batchnorm)
    weight_before = linear.weight.detach().clone()
    modes = []
    trainer = _trainer(
        {"trunk": trunk},
        _dataset(),
        freeze_trunk_batchnorm=freeze,
        end_of_iteration_hook=lambda t: modes.append((trunk.training, batchnorm.training)),
    )
    trainer.train(num_epochs=1)

    running = ("running_mean", "running_var", "num_batches_tracked")
    unchanged = [torch.equal(getattr(batchnorm, name), stats_before[name]) for name in running]
    assert unchanged == [freeze] * 3
    assert not torch.equal(linear.weight, weight_before)  # the rest of the trunk learns
    assert set(modes) == {(True, not freeze)}


# --- set_min_label_to_zero / dataset_labels -------------------------------------------------


def _recording_loss(seen: list[list[int]]) -> Any:
    def loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        seen.append(labels.tolist())
        return embeddings.pow(2).mean()

    return loss


def test_set_min_label_to_zero_maps_labels_to_their_rank() -> None:
    labels = torch.tensor([30, 10, 70, 10, 30, 70, 50, 50])
    seen: list[list[int]] = []
    trainer = _trainer(
        {"trunk": torch.nn.Linear(6, 3)},
        _dataset(8, labels),
        loss_funcs={"metric_loss": _recording_loss(seen)},
        set_min_label_to_zero=True,
        dataset_labels=labels.tolist(),
    )
    trainer.train()
    rank = {10: 0, 30: 1, 50: 2, 70: 3}  # sorted unique labels of the dataset
    assert seen == [[rank[v] for v in labels[:4].tolist()], [rank[v] for v in labels[4:].tolist()]]


def test_set_min_label_to_zero_uses_the_trained_hierarchy_level() -> None:
    labels = torch.tensor([[5, 200], [5, 100], [9, 300], [9, 100]])
    seen: list[list[int]] = []
    _trainer(
        {"trunk": torch.nn.Linear(6, 3)},
        _dataset(4, labels),
        loss_funcs={"metric_loss": _recording_loss(seen)},
        label_hierarchy_level=1,
        set_min_label_to_zero=True,
        dataset_labels=labels.numpy(),
    ).train()
    assert seen == [[1, 0, 2, 0]]


def test_labels_pass_unchanged_without_set_min_label_to_zero() -> None:
    labels = torch.tensor([30, 10, 70, 10])
    seen: list[list[int]] = []
    _trainer(
        {"trunk": torch.nn.Linear(6, 3)},
        _dataset(4, labels),
        loss_funcs={"metric_loss": _recording_loss(seen)},
        dataset_labels=labels,
    ).train()
    assert seen == [[30, 10, 70, 10]]


def test_set_min_label_to_zero_needs_dataset_labels() -> None:
    with pytest.raises(InvalidArgumentError, match="'dataset_labels' parameter of MetricLossOnly"):
        _trainer({"trunk": torch.nn.Linear(6, 3)}, _dataset(), set_min_label_to_zero=True)
    with pytest.raises(InvalidTypeError, match="'set_min_label_to_zero' parameter"):
        _trainer({"trunk": torch.nn.Linear(6, 3)}, _dataset(), set_min_label_to_zero="yes")
