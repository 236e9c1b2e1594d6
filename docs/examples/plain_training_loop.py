"""A plain PyTorch training loop, without a trainer class, using the logging-preset hooks.

The hooks need an object with the attributes a trainer has (``models``, ``optimizers``,
``epoch``, ``losses``, ``get_global_iteration()``); ``logging_presets.TrainingState`` is
that object for a hand-written loop. Run it twice with the same folder and the second run
resumes after the last saved epoch::

    python docs/examples/plain_training_loop.py /tmp/pml_example

Resuming refuses (``ResumeError``, every file untouched) when the folder's checkpoints are
of other objects or the records have no matching checkpoint; to start over in the same
folder, call ``hooks.load_latest_saved_models(state, folder, start_fresh=True)``, which
moves the old checkpoints and records aside.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from pytorch_metric_learning import testers
from pytorch_metric_learning.utils import logging_presets


def make_dataset(n_per_class: int, seed: int) -> TensorDataset:
    """Four Gaussian clusters in 8 dimensions, two of which carry the class."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(4).repeat_interleave(n_per_class)
    centers = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    signal = centers[labels] + 0.6 * torch.randn(len(labels), 2, generator=g)
    noise = 1.5 * torch.randn(len(labels), 6, generator=g)
    return TensorDataset(torch.cat([signal, noise], dim=1), labels)


def contrastive_loss(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Same label: cosine similarity towards 1; different labels: below 0.2."""
    x = torch.nn.functional.normalize(embeddings, dim=1)
    sim = x @ x.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~torch.eye(len(labels), dtype=torch.bool)
    return (1 - sim)[same & off_diagonal].mean() + torch.relu(sim - 0.2)[~same].mean()


def main(
    folder: str | Path, num_epochs: int = 6, patience: int = 2
) -> logging_presets.HookContainer:
    """Train with validation every epoch, best-model saving and early stopping."""
    folder = Path(folder)
    torch.manual_seed(0)
    train_ds, val_ds = make_dataset(16, seed=1), make_dataset(8, seed=2)
    trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(trunk.parameters(), lr=0.05)

    record_keeper, _, _ = logging_presets.get_record_keeper(folder / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = testers.GlobalEmbeddingSpaceTester(
        end_of_testing_hook=hooks.end_of_testing_hook,
        dataloader_num_workers=0,
        data_device="cpu",
        progress_bar=False,
    )
    end_of_epoch_hook = hooks.end_of_epoch_hook(
        tester, {"val": val_ds}, folder / "saved_models", patience=patience
    )

    state = logging_presets.TrainingState(
        models={"trunk": trunk}, optimizers={"trunk_optimizer": optimizer}
    )
    start_epoch = hooks.load_latest_saved_models(state, folder / "saved_models")
    loader = DataLoader(train_ds, batch_size=16, shuffle=True, drop_last=True)

    for epoch in range(start_epoch, num_epochs + 1):
        state.epoch = epoch
        state.global_iteration = (epoch - 1) * len(loader)
        trunk.train()
        for data, labels in loader:
            loss = contrastive_loss(trunk(data), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state.losses = {"metric_loss": loss.item()}
            hooks.end_of_iteration_hook(state)
            state.global_iteration += 1
        if end_of_epoch_hook(state) is False:
            break
    return hooks


if __name__ == "__main__":
    hooks = main(sys.argv[1] if len(sys.argv) > 1 else "pml_example")
    best_epoch, best = hooks.get_best_epoch_and_accuracy(None, "val")
    print(f"best epoch {best_epoch}: precision_at_1 = {best:.3f}")
    print(hooks.get_accuracy_history(None, "val", metrics=["precision_at_1", "NMI"]))
