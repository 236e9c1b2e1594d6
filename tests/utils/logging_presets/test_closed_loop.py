"""The spec's "Closing the training loop" sample with the real tester and trainer.

The sample runs verbatim on a tiny synthetic dataset with a small loss written here; the
checks compare what was recorded and saved with a brute-force evaluation of the saved
models.
"""

from __future__ import annotations

import csv
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import RandomSampler, TensorDataset

from pytorch_metric_learning import testers, trainers
from pytorch_metric_learning.utils import logging_presets

METRICS = ["precision_at_1", "r_precision", "mean_average_precision_at_r", "NMI", "AMI"]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def clusters(n_per_class: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions; only 2 dimensions carry the class."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(4).repeat_interleave(n_per_class)
    centers = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    signal = centers[labels] + 0.3 * torch.randn(len(labels), 2, generator=g)
    noise = 0.5 * torch.randn(len(labels), 6, generator=g)
    return TensorDataset(torch.cat([signal, noise], dim=1), labels)


def contrastive_loss(
    embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any
) -> torch.Tensor:
    """Cosine contrastive loss: same label -> similarity 1, other labels -> below 0.2."""
    x = torch.nn.functional.normalize(embeddings, dim=1)
    sim = x @ x.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    positive = (1 - sim)[same & off_diagonal].mean()
    negative = torch.relu(sim - 0.2)[~same].mean()
    return positive + negative


def all_pairs_miner(embeddings: torch.Tensor, labels: torch.Tensor) -> None:
    return None  # the loss uses every pair


def build(seed: int = 0, lr: float = 0.05) -> dict[str, Any]:
    torch.manual_seed(seed)
    trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).to(DEVICE)
    embedder = torch.nn.Linear(16, 4).to(DEVICE)
    train_dataset = clusters(16, seed=1)
    return {
        "models": {"trunk": trunk, "embedder": embedder},
        "optimizers": {
            "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=lr),
            "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=lr),
        },
        "batch_size": 16,
        "loss_funcs": {"metric_loss": contrastive_loss},
        "mining_funcs": {"tuple_miner": all_pairs_miner},
        "train_dataset": train_dataset,
        "sampler": RandomSampler(train_dataset, generator=torch.Generator().manual_seed(2)),
        "val_ds": clusters(8, seed=3),
    }


def brute_force_map_at_r(trunk: Any, embedder: Any, dataset: TensorDataset) -> float:
    """MAP@R of the val split against itself, by a loop over queries."""
    data, labels = dataset.tensors
    with torch.no_grad():
        trunk.eval()
        embedder.eval()
        emb = torch.nn.functional.normalize(embedder(trunk(data.to(DEVICE))), dim=1).cpu()
    total = 0.0
    for i in range(len(labels)):
        others = [j for j in range(len(labels)) if j != i]
        order = sorted(others, key=lambda j: float((emb[i] - emb[j]).norm()))
        r = sum(int(labels[j] == labels[i]) for j in others)
        hits, precision_sum = 0, 0.0
        for rank, j in enumerate(order[:r], start=1):
            if labels[j] == labels[i]:
                hits += 1
                precision_sum += hits / rank
        total += precision_sum / r
    return total / len(labels)


def test_closed_loop_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")  # the sample logs to TensorBoard
    monkeypatch.chdir(tmp_path)
    parts = build()
    models, optimizers, batch_size = parts["models"], parts["optimizers"], parts["batch_size"]
    loss_funcs, mining_funcs = parts["loss_funcs"], parts["mining_funcs"]
    train_dataset, sampler, val_ds = parts["train_dataset"], parts["sampler"], parts["val_ds"]
    num_epochs = 4

    # ---- the spec's sample, verbatim
    # fmt: off
    record_keeper, _, _ = logging_presets.get_record_keeper("logs", "tensorboard_logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = testers.GlobalEmbeddingSpaceTester(end_of_testing_hook=hooks.end_of_testing_hook)
    end_of_epoch_hook = hooks.end_of_epoch_hook(tester, {"val": val_ds}, "saved_models")
    trainer = trainers.MetricLossOnly(models, optimizers, batch_size, loss_funcs,
        mining_funcs, train_dataset, sampler=sampler,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=end_of_epoch_hook)
    trainer.train(num_epochs=num_epochs)
    # fmt: on
    # ----

    epochs = list(range(1, num_epochs + 1))
    history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
    assert history["epoch"] == epochs
    keys = [f"{m}_level0" for m in METRICS]
    assert set(keys) <= set(history)

    # SQLite (read with plain sqlite3) and CSV hold every epoch of every metric.
    with sqlite3.connect(tmp_path / "logs" / "records.db") as conn:
        for key in keys:
            rows = conn.execute(
                "SELECT step, value FROM records WHERE record_group = 'accuracies_val' "
                "AND name = ? ORDER BY step",
                (key,),
            ).fetchall()
            assert rows == list(zip(epochs, history[key]))
            with open(tmp_path / "logs" / "accuracies_val" / f"{key}.csv", newline="") as f:
                table = list(csv.reader(f))
            assert table[0] == ["epoch", key]
            assert [(int(e), float(v)) for e, v in table[1:]] == rows

    # The last epoch's accuracies are what the tester computed last.
    for key in keys:
        assert history[key][-1] == pytest.approx(tester.all_accuracies["val"][key])

    # The best checkpoint holds the epoch with the best MAP@R, and re-evaluating it
    # by brute force gives the recorded value.
    maps = history["mean_average_precision_at_r_level0"]
    best_epoch = 1 + maps.index(max(maps))
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (best_epoch, max(maps))
    saved = sorted(p.name for p in (tmp_path / "saved_models").iterdir())
    names = ["embedder", "embedder_optimizer", "trunk", "trunk_optimizer"]
    assert saved == sorted(
        [f"{n}_{num_epochs}.pth" for n in names] + [f"{n}_best{best_epoch}.pth" for n in names]
    )
    fresh = build(seed=99)
    fresh_trainer = trainers.MetricLossOnly(
        fresh["models"], fresh["optimizers"], 16, fresh["loss_funcs"], None, fresh["train_dataset"]
    )
    assert hooks.load_best_saved_models(fresh_trainer, "saved_models", DEVICE) == best_epoch
    trunk, embedder = fresh["models"]["trunk"], fresh["models"]["embedder"]
    assert brute_force_map_at_r(trunk, embedder, val_ds) == pytest.approx(max(maps), abs=1e-6)
    hooks.load_latest_saved_models(fresh_trainer, "saved_models", DEVICE)
    assert brute_force_map_at_r(trunk, embedder, val_ds) == pytest.approx(maps[-1], abs=1e-6)

    # Losses went to the record keeper, one row every log_freq iterations of an epoch (2.x).
    losses = hooks.get_loss_history()
    per_epoch = trainer.iterations_per_epoch
    logged = [g for g in range(num_epochs * per_epoch) if (g % per_epoch) % hooks.log_freq == 0]
    assert losses["iteration"] == logged
    assert all(v == v for v in losses["metric_loss"])
    assert list((tmp_path / "tensorboard_logs").iterdir())


def run_real(tmp_path: Path, num_epochs: int, lr: float, **hook_kwargs: Any):
    parts = build(lr=lr)
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = testers.GlobalEmbeddingSpaceTester(
        end_of_testing_hook=hooks.end_of_testing_hook,
        dataloader_num_workers=0,
        data_device=DEVICE,
        progress_bar=False,
    )
    hook = hooks.end_of_epoch_hook(tester, {"val": parts["val_ds"]}, tmp_path / "m", **hook_kwargs)
    trainer = trainers.MetricLossOnly(
        parts["models"],
        parts["optimizers"],
        parts["batch_size"],
        parts["loss_funcs"],
        parts["mining_funcs"],
        parts["train_dataset"],
        sampler=parts["sampler"],
        dataloader_num_workers=0,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=hook,
    )
    trainer.train(num_epochs=num_epochs)
    return hooks, tester, trainer


def test_patience_stops_early_with_the_real_tester(tmp_path: Path) -> None:
    # lr=0: the accuracy never improves after epoch 1, so patience=1 stops at epoch 3.
    hooks, tester, trainer = run_real(tmp_path, num_epochs=10, lr=0.0, patience=1)
    assert trainer.epoch == 3
    history = hooks.get_accuracy_history(tester, "val")
    assert history["epoch"] == [1, 2, 3]
    assert len(set(history["mean_average_precision_at_r_level0"])) == 1
    assert hooks.get_best_epoch_and_accuracy(tester, "val")[0] == 1


def test_test_interval_with_the_real_tester(tmp_path: Path) -> None:
    hooks, tester, trainer = run_real(tmp_path, num_epochs=5, lr=0.05, test_interval=2)
    assert trainer.epoch == 5
    assert hooks.get_accuracy_history(tester, "val", metrics=["precision_at_1"])["epoch"] == [2, 4]
    assert (tmp_path / "m" / "trunk_4.pth").exists() and not (
        tmp_path / "m" / "trunk_5.pth"
    ).exists()
