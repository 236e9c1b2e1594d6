"""MetricLossOnly against a hand-written training loop, and its arguments."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from pytorch_metric_learning import trainers
from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError


def pull_loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
    """Mean squared distance of same-label pairs minus that of other pairs."""
    d = torch.cdist(embeddings, embeddings) ** 2
    same = labels[:, None] == labels[None, :]
    return d[same].mean() - 0.1 * d[~same].mean()


def setup(seed: int = 0, n: int = 12) -> dict[str, Any]:
    torch.manual_seed(seed)
    data = torch.randn(n, 5)
    labels = torch.arange(n) % 3
    trunk = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU())
    embedder = torch.nn.Linear(4, 2)
    return {
        "data": data,
        "labels": labels,
        "trunk": trunk,
        "embedder": embedder,
        "dataset": TensorDataset(data, labels),
    }


def make(parts: dict[str, Any], lr: float = 0.1, **kwargs: Any) -> trainers.MetricLossOnly:
    trunk, embedder = parts["trunk"], parts["embedder"]
    defaults: dict[str, Any] = dict(
        models={"trunk": trunk, "embedder": embedder},
        optimizers={
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=lr),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=lr),
        },
        batch_size=4,
        loss_funcs={"metric_loss": pull_loss},
        mining_funcs={},
        dataset=parts["dataset"],
        sampler=SequentialSampler(parts["dataset"]),
        dataloader_num_workers=0,
    )
    defaults.update(kwargs)
    return trainers.MetricLossOnly(**defaults)


def hand_written_loop(parts: dict[str, Any], epochs: int, lr: float = 0.1, weight: float = 1.0):
    """The same training written out: plain SGD over sequential batches of 4."""
    trunk, embedder = copy.deepcopy(parts["trunk"]), copy.deepcopy(parts["embedder"])
    params = list(trunk.parameters()) + list(embedder.parameters())
    losses = []
    for _ in range(epochs):
        for start in range(0, len(parts["data"]) - 3, 4):
            x, y = parts["data"][start : start + 4], parts["labels"][start : start + 4]
            loss = weight * pull_loss(embedder(trunk(x)), y, None)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g
            losses.append(loss.item())
    return trunk, embedder, losses


def test_matches_a_hand_written_loop() -> None:
    parts = setup()
    expected_trunk, expected_embedder, expected_losses = hand_written_loop(parts, epochs=2)
    seen = []
    trainer = make(parts, end_of_iteration_hook=lambda t: seen.append(dict(t.losses)))
    trainer.train(num_epochs=2)
    for got, want in zip(parts["trunk"].parameters(), expected_trunk.parameters()):
        torch.testing.assert_close(got, want)
    for got, want in zip(parts["embedder"].parameters(), expected_embedder.parameters()):
        torch.testing.assert_close(got, want)
    assert [s["metric_loss"] for s in seen] == pytest.approx(expected_losses)
    assert [s["total_loss"] for s in seen] == pytest.approx(expected_losses)


def test_loss_weights_scale_the_total() -> None:
    parts = setup()
    expected_trunk, _, expected_losses = hand_written_loop(parts, epochs=1, weight=0.5)
    seen = []
    trainer = make(
        parts,
        loss_weights={"metric_loss": 0.5},
        end_of_iteration_hook=lambda t: seen.append(dict(t.losses)),
    )
    trainer.train()
    for got, want in zip(parts["trunk"].parameters(), expected_trunk.parameters()):
        torch.testing.assert_close(got, want)
    assert [s["total_loss"] for s in seen] == pytest.approx(expected_losses)
    assert [s["metric_loss"] for s in seen] == pytest.approx([2 * v for v in expected_losses])


def test_without_embedder_the_trunk_output_is_the_embedding() -> None:
    parts = setup()
    received = []

    def loss(embeddings, labels, indices_tuple):
        received.append(embeddings.shape)
        return embeddings.pow(2).mean()

    trunk = parts["trunk"]
    trainer = trainers.MetricLossOnly(
        {"trunk": trunk},
        {"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)},
        4,
        {"metric_loss": loss},
        None,
        parts["dataset"],
        dataloader_num_workers=0,
    )
    trainer.train()
    assert received == [torch.Size([4, 4])] * 3


def test_miner_output_reaches_the_loss() -> None:
    parts = setup()
    calls = []

    def miner(embeddings, labels):
        calls.append(("miner", labels.tolist()))
        return ("indices", len(labels))

    def loss(embeddings, labels, indices_tuple):
        calls.append(("loss", indices_tuple))
        return embeddings.sum() * 0

    make(parts, loss_funcs={"metric_loss": loss}, mining_funcs={"tuple_miner": miner}).train()
    assert calls == [
        ("miner", [0, 1, 2, 0]),
        ("loss", ("indices", 4)),
        ("miner", [1, 2, 0, 1]),
        ("loss", ("indices", 4)),
        ("miner", [2, 0, 1, 2]),
        ("loss", ("indices", 4)),
    ]


def test_epochs_iterations_and_hooks() -> None:
    parts = setup()
    log = []
    trainer = make(
        parts,
        end_of_iteration_hook=lambda t: log.append(("it", t.epoch, t.get_global_iteration())),
        end_of_epoch_hook=lambda t: log.append(("epoch", t.epoch)),
    )
    trainer.train(start_epoch=3, num_epochs=4)
    assert trainer.iterations_per_epoch == 3
    assert log == [
        ("it", 3, 6),
        ("it", 3, 7),
        ("it", 3, 8),
        ("epoch", 3),
        ("it", 4, 9),
        ("it", 4, 10),
        ("it", 4, 11),
        ("epoch", 4),
    ]


def test_end_of_epoch_hook_returning_false_stops() -> None:
    parts = setup()
    trainer = make(parts, end_of_epoch_hook=lambda t: t.epoch < 2)
    trainer.train(num_epochs=10)
    assert trainer.epoch == 2


def test_iterations_per_epoch_cycles_the_data() -> None:
    parts = setup()
    batches = []

    def loss(embeddings, labels, indices_tuple):
        batches.append(labels.tolist())
        return embeddings.sum() * 0

    make(parts, iterations_per_epoch=4, loss_funcs={"metric_loss": loss}).train(num_epochs=2)
    one_pass = [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2]]
    assert batches == (one_pass * 3)[:8]


def test_schedulers_and_gradient_clippers() -> None:
    parts = setup()
    counts = {"clip": 0}

    class Counter:
        def __init__(self) -> None:
            self.steps: list[Any] = []

        def step(self, *args: Any) -> None:
            self.steps.append(args)

    by_iteration, by_epoch, by_plateau = Counter(), Counter(), Counter()

    def clip() -> None:
        counts["clip"] += 1
        torch.nn.utils.clip_grad_norm_(parts["trunk"].parameters(), 1e-3)

    trainer = make(
        parts,
        lr_schedulers={
            "trunk_scheduler_by_iteration": by_iteration,
            "trunk_scheduler_by_epoch": by_epoch,
            "trunk_scheduler_by_plateau": by_plateau,
        },
        gradient_clippers={"trunk_grad_clipper": clip},
    )
    before = [p.detach().clone() for p in parts["trunk"].parameters()]
    trainer.train(num_epochs=2)
    assert len(by_iteration.steps) == 6 and len(by_epoch.steps) == 2 and by_plateau.steps == []
    assert counts["clip"] == 6
    trainer.step_lr_plateau_schedulers(0.75)
    assert by_plateau.steps == [(0.75,)]
    with torch.no_grad():
        deltas = [(p - b).flatten() for p, b in zip(parts["trunk"].parameters(), before)]
        moved = float(torch.cat(deltas).norm())
    assert 0 < moved <= 6 * 0.1 * 1e-3 + 1e-9  # six clipped steps of lr 0.1


def test_real_scheduler_changes_the_learning_rate() -> None:
    parts = setup()
    trainer = make(parts)
    optimizer = trainer.optimizers["trunk_optimizer"]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer.lr_schedulers = {"trunk_by_epoch": scheduler}
    trainer.train(num_epochs=3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_hierarchical_labels_and_dtype() -> None:
    parts = setup()
    labels = torch.stack([parts["labels"], parts["labels"] // 2 + 10], dim=1)
    dataset = TensorDataset(parts["data"].double(), labels)
    seen = []

    def loss(embeddings, labels, indices_tuple):
        seen.append((embeddings.dtype, labels.tolist()))
        return embeddings.sum() * 0

    trunk = torch.nn.Linear(5, 3).double()
    trainer = trainers.MetricLossOnly(
        {"trunk": trunk},
        {},
        4,
        {"metric_loss": loss},
        {},
        dataset,
        sampler=SequentialSampler(dataset),
        dataloader_num_workers=0,
        dtype=torch.float64,
        label_hierarchy_level=1,
    )
    trainer.train()
    assert seen[0] == (torch.float64, [10, 10, 11, 10])


def test_data_and_label_getter_and_collate_fn() -> None:
    parts = setup()
    dataset = [{"x": x, "y": int(y)} for x, y in zip(parts["data"], parts["labels"])]

    def collate(items):
        return {
            "x": torch.stack([i["x"] for i in items]),
            "y": torch.tensor([i["y"] for i in items]),
        }

    seen = []

    def loss(embeddings, labels, indices_tuple):
        seen.append(labels.tolist())
        return embeddings.sum() * 0

    make(
        parts,
        dataset=dataset,
        sampler=SequentialSampler(dataset),
        collate_fn=collate,
        data_and_label_getter=lambda b: (b["x"], b["y"]),
        loss_funcs={"metric_loss": loss},
    ).train()
    assert seen == [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2]]


def test_loss_without_gradient_skips_the_step() -> None:
    parts = setup()
    before = [p.detach().clone() for p in parts["trunk"].parameters()]
    make(parts, loss_funcs={"metric_loss": lambda e, y, t: 0.0}).train()
    assert all(torch.equal(p, b) for p, b in zip(parts["trunk"].parameters(), before))


def test_worker_processes() -> None:
    parts = setup()
    expected_trunk, _, _ = hand_written_loop(parts, epochs=2)
    make(parts, dataloader_num_workers=1).train(num_epochs=2)
    for got, want in zip(parts["trunk"].parameters(), expected_trunk.parameters()):
        torch.testing.assert_close(got, want)


def test_models_are_put_back_in_training_mode() -> None:
    parts = setup()
    modes = []
    trainer = make(parts, end_of_iteration_hook=lambda t: modes.append(t.models["trunk"].training))
    parts["trunk"].eval()
    trainer.train()
    assert modes == [True, True, True]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"models": {"embedder": torch.nn.Linear(1, 1)}}, InvalidArgumentError, "'models'"),
        ({"models": [torch.nn.Linear(1, 1)]}, InvalidTypeError, "'models'"),
        ({"loss_funcs": {"other": pull_loss}}, InvalidArgumentError, "'loss_funcs'"),
        ({"loss_funcs": {"metric_loss": 3}}, InvalidArgumentError, "'loss_funcs'"),
        ({"mining_funcs": {"foo_miner": len}}, InvalidArgumentError, "'mining_funcs'"),
        ({"batch_size": 0}, InvalidArgumentError, "'batch_size'"),
        ({"batch_size": 2.0}, InvalidTypeError, "'batch_size'"),
        ({"loss_weights": {"nope": 1.0}}, InvalidArgumentError, "'loss_weights'"),
        ({"loss_weights": {"metric_loss": "1"}}, InvalidTypeError, "'loss_weights'"),
        ({"lr_schedulers": {"trunk": None}}, InvalidArgumentError, "'lr_schedulers'"),
        ({"dataloader_num_workers": -1}, InvalidArgumentError, "'dataloader_num_workers'"),
        ({"iterations_per_epoch": 0}, InvalidArgumentError, "'iterations_per_epoch'"),
        ({"label_hierarchy_level": -1}, InvalidArgumentError, "'label_hierarchy_level'"),
    ],
)
def test_argument_errors(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        make(setup(), **kwargs)


def test_dataset_smaller_than_a_batch() -> None:
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        make(setup(n=3)).train()


@pytest.mark.parametrize("kwargs", [{"start_epoch": 0}, {"num_epochs": 0}])
def test_train_arguments(kwargs) -> None:
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        make(setup()).train(**kwargs)
