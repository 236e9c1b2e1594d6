"""A scripted stand-in for a tester and a tiny training set-up, shared by the hook tests."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from pytorch_metric_learning import trainers

PRIMARY_KEY = "mean_average_precision_at_r_level0"


class ScriptedTester:
    """Has the tester interface (``test``, ``all_accuracies``, ``end_of_testing_hook``);
    its accuracies come from ``script(epoch) -> {key: value}`` instead of a model."""

    def __init__(
        self,
        script: Mapping[int, float] | Callable[[int], dict[str, float]],
        end_of_testing_hook: Callable[[Any], None] | None = None,
    ) -> None:
        self.script = script
        self.end_of_testing_hook = end_of_testing_hook
        self.all_accuracies: dict[str, dict[str, float]] = {}
        self.calls: list[int] = []
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def accuracies(self, epoch: int) -> dict[str, float]:
        if callable(self.script):
            return self.script(epoch)
        return {PRIMARY_KEY: self.script[epoch], "precision_at_1_level0": 1.0 - self.script[epoch]}

    def test(
        self,
        dataset_dict: Mapping[str, Any],
        epoch: int,
        trunk_model: torch.nn.Module,
        embedder_model: torch.nn.Module | None = None,
        splits_to_eval: Any = None,
        collate_fn: Any = None,
    ) -> dict[str, dict[str, float]]:
        self.calls.append(epoch)
        self.snapshots[epoch] = {k: v.detach().clone() for k, v in trunk_model.state_dict().items()}
        splits = [query for query, _ in splits_to_eval] if splits_to_eval else list(dataset_dict)
        self.all_accuracies = {split: self.accuracies(epoch) for split in splits}
        if self.end_of_testing_hook is not None:
            self.end_of_testing_hook(self)
        return self.all_accuracies


def spread_loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
    """Pull same-label embeddings together, push others apart (a toy contrastive loss)."""
    d = torch.cdist(embeddings, embeddings)
    same = labels[:, None] == labels[None, :]
    return d[same].mean() - d[~same].clamp(max=2.0).mean()


def make_trainer(**overrides: Any) -> trainers.MetricLossOnly:
    torch.manual_seed(0)
    data = torch.randn(16, 6)
    labels = torch.arange(16) % 4
    trunk = torch.nn.Linear(6, 4)
    embedder = torch.nn.Linear(4, 3)
    kwargs: dict[str, Any] = dict(
        models={"trunk": trunk, "embedder": embedder},
        optimizers={
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.05),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=0.05),
        },
        batch_size=8,
        loss_funcs={"metric_loss": spread_loss},
        mining_funcs={},
        dataset=TensorDataset(data, labels),
        dataloader_num_workers=0,
    )
    kwargs.update(overrides)
    return trainers.MetricLossOnly(**kwargs)


def folder_snapshot(root: Path) -> dict[str, Any]:
    """Everything a user could lose under ``root``: the bytes of every checkpoint and CSV
    file, and the rows of every SQLite table (read with plain sqlite3)."""
    snapshot: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".pth", ".csv"):
            snapshot[str(path.relative_to(root))] = path.read_bytes()
        elif path.is_file() and path.suffix == ".db":
            with contextlib.closing(sqlite3.connect(path)) as conn:
                tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                for (table,) in tables.fetchall():
                    rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
                    snapshot[f"{path.relative_to(root)}:{table}"] = sorted(rows, key=repr)
    return snapshot
