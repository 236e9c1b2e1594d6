"""AccuracyCallback in a real ``lightning.Trainer`` (CPU, ``strategy="ddp"``, 2 gloo
processes) on the UCI digits: the docs' example script, run as it is, with a model that
also records the embeddings each rank computed. The logged metrics must equal
AccuracyCalculator's in one process on those very embeddings, each validation row once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import AccuracyCalculator

pytest.importorskip("lightning")
pytest.importorskip("sklearn")

import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from pytorch_metric_learning.integrations.lightning import AccuracyCallback, loggable  # noqa: E402
from test_docs import ROOT, fenced_blocks  # noqa: E402

VALIDATION_ROWS = 597  # docs' train_digits.py: 1,797 digits, 1,200 for training
OPTIONS = {"k": "max_bin_count", "exclude": ("NMI", "AMI")}

CHECK = f"""
import torch
import lightning as L
from train_digits import DigitsEmbedder, fit
from pytorch_metric_learning.integrations.lightning import AccuracyCallback


class Recording(DigitsEmbedder):
    def on_validation_epoch_start(self):
        self.rows = []

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        self.rows.append({{name: value.detach().clone() for name, value in out.items()}})
        return out


class BySize(AccuracyCallback):
    def on_validation_batch_end(self, trainer, module, outputs, *args, **kwargs):
        no_indices = {{"embeddings": outputs["embeddings"], "labels": outputs["labels"]}}
        super().on_validation_batch_end(trainer, module, no_indices, *args, **kwargs)


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    model = Recording()
    by_index = AccuracyCallback(**{OPTIONS!r})
    by_size = BySize(prefix="size_", num_samples={VALIDATION_ROWS}, **{OPTIONS!r})
    # neither indices nor num_samples: the length comes from the DistributedSampler's dataset
    derived = BySize(prefix="derived_", **{OPTIONS!r})
    trainer = fit(model, [by_index, by_size, derived], epochs=2)
    logged = {{name: float(value) for name, value in trainer.callback_metrics.items()}}
    torch.save(
        {{"rows": model.rows, "by_index": by_index.last_accuracies,
          "by_size": by_size.last_accuracies, "logged": logged,
          "derived": derived.last_accuracies, "derived_rows": derived.accumulator.num_samples}},
        f"rank{{trainer.global_rank}}.pt",
    )
"""


def docs_script() -> str:
    text = (ROOT / "docs" / "lightning.md").read_text(encoding="utf-8")
    return next(block.code for block in fenced_blocks(text) if block.file == "train_digits.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("lightning")
    (folder / "train_digits.py").write_text(docs_script() + "\n")
    (folder / "check.py").write_text(CHECK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "check.py"], cwd=folder, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def single_process(ranks: list[dict]) -> dict:
    """AccuracyCalculator on the rows of rank 0 then rank 1, each dataset index once."""
    embeddings, labels, seen = [], [], set()
    for result in ranks:
        for batch in result["rows"]:
            for row, label, index in zip(batch["embeddings"], batch["labels"], batch["indices"]):
                if int(index) not in seen:
                    seen.add(int(index))
                    embeddings.append(row)
                    labels.append(label)
    assert sorted(seen) == list(range(VALIDATION_ROWS))
    return AccuracyCalculator(**OPTIONS).get_accuracy(torch.stack(embeddings), torch.stack(labels))


@pytest.mark.slow
def test_ddp_validation_metrics_equal_one_process_on_the_same_embeddings(ranks) -> None:
    assert [result["derived_rows"] for result in ranks] == [VALIDATION_ROWS] * 2
    received = sum(len(batch["labels"]) for result in ranks for batch in result["rows"])
    assert received == VALIDATION_ROWS + 1  # the sampler repeated one row
    expected = single_process(ranks)
    assert 0.5 < expected["precision_at_1"] < 1.0  # trained, and not trivially
    for result in ranks:
        for name, value in expected.items():
            assert result["by_index"][name] == pytest.approx(value, rel=1e-12, abs=0), name
            assert result["by_size"][name] == pytest.approx(value, rel=1e-12, abs=0), name
            assert result["derived"][name] == pytest.approx(value, rel=1e-12, abs=0), name
            assert result["logged"][f"val_{name}"] == pytest.approx(value, rel=1e-6), name
            assert result["logged"][f"size_{name}"] == pytest.approx(value, rel=1e-6), name


def test_a_validation_step_output_without_embeddings_is_refused() -> None:
    callback = AccuracyCallback()
    with pytest.raises(InvalidArgumentError, match="'embeddings'.*Got the keys \\['labels'\\]"):
        callback.on_validation_batch_end(None, None, {"labels": torch.zeros(2)}, None, 0)
    with pytest.raises(InvalidTypeError, match="a mapping.*Got Tensor"):
        callback.on_validation_batch_end(None, None, torch.zeros(2), None, 0)
    outputs = {"embeddings": torch.zeros(2, 3), "labels": torch.zeros(2)}
    with pytest.raises(InvalidArgumentError, match="Got a batch of dataloader 1"):
        callback.on_validation_batch_end(None, None, outputs, None, 0, 1)


# ----- one process, a real Trainer: trainer.validate runs under torch.inference_mode -----


class Projecting(L.LightningModule):
    """A fixed linear embedding; validation_step returns what AccuracyCallback reads."""

    def __init__(self, with_indices: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(3, 2)
        self.with_indices = with_indices
        self.inference = False

    def validation_step(self, batch, batch_idx):
        x, y, indices = batch
        embeddings = self.embed(x)
        self.inference = embeddings.is_inference()
        outputs = {"embeddings": embeddings, "labels": y}
        return {**outputs, "indices": indices} if self.with_indices else outputs


def small_set(rows: int = 30) -> TensorDataset:
    """Labels 10 to 50 (five or six rows each) and one label, 99, seen once."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([10, 20, 30, 40, 50])[torch.arange(rows) % 5]
    labels[-1] = 99
    x = torch.randn(rows, 3, generator=generator) + (labels.float() / 10).unsqueeze(1)
    return TensorDataset(x, labels, torch.arange(rows))


def validate(
    callback: AccuracyCallback, loader: DataLoader, model: Projecting, **options
) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[callback], **options,
    )  # fmt: skip
    trainer.validate(model, loader, verbose=False)
    return trainer


def precision_at_1_by_label(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[int, float]:
    """A plain loop: each row's nearest other row, averaged per label with 2+ rows."""
    hits: dict[int, list[int]] = {}
    for row in range(len(labels)):
        distance = ((embeddings - embeddings[row]) ** 2).sum(dim=1)
        distance[row] = float("inf")
        hits.setdefault(int(labels[row]), []).append(
            int(labels[int(distance.argmin())] == labels[row])
        )
    return {label: sum(h) / len(h) for label, h in hits.items() if len(h) >= 2}


@pytest.mark.parametrize("with_indices", [True, False])
def test_trainer_validate_in_inference_mode_logs_each_class_by_label(with_indices) -> None:
    callback = AccuracyCallback(include=("precision_at_1",), return_per_class=True)
    model = Projecting(with_indices)
    dataset = small_set()
    trainer = validate(callback, DataLoader(dataset, batch_size=7, shuffle=True), model)
    assert model.inference  # Lightning's default: the embeddings are inference tensors
    assert callback.accumulator.num_samples == 30  # read from the loader's dataset
    x, labels, _ = dataset.tensors
    with torch.no_grad():
        expected = precision_at_1_by_label(model.embed(x), labels)
    assert sorted(expected) == [10, 20, 30, 40, 50]
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert logged == pytest.approx({f"val_precision_at_1/{c}": v for c, v in expected.items()})


def test_num_samples_unlike_the_dataset_length_is_refused() -> None:
    callback = AccuracyCallback(num_samples=31, include=("precision_at_1",))
    with pytest.raises(
        InvalidArgumentError, match="'num_samples'.*len\\(dataloader.dataset\\) = 30. Got 31"
    ):
        validate(callback, DataLoader(small_set(), batch_size=7), Projecting())


@pytest.mark.parametrize(
    ("loader_options", "trainer_options"),
    [({"drop_last": True}, {}), ({}, {"limit_val_batches": 2})],
)
def test_num_samples_with_indices_refuses_a_part_of_the_set(
    loader_options, trainer_options
) -> None:
    callback = AccuracyCallback(num_samples=30, include=("precision_at_1",))
    loader = DataLoader(small_set(), batch_size=7, **loader_options)
    with pytest.raises(
        InvalidArgumentError, match="distinct dataset rows, but 'num_samples' is 30"
    ):
        validate(callback, loader, Projecting(), **trainer_options)


@pytest.mark.parametrize(
    ("loader_options", "trainer_options", "expected"),
    [
        ({}, {}, 30),
        ({"shuffle": True}, {}, 30),
        ({"drop_last": True}, {}, None),  # the last 2 rows never arrive
        ({}, {"limit_val_batches": 2}, None),  # cut short
        ({"sampler": [0, 1, 2, 3]}, {}, None),  # a sampler that reads part of the set
    ],
)
def test_num_samples_is_read_from_the_dataset_only_when_it_is_read_whole(
    loader_options, trainer_options, expected
) -> None:
    callback = AccuracyCallback(include=("precision_at_1",))
    loader = DataLoader(small_set(), batch_size=7, **loader_options)
    validate(callback, loader, Projecting(), **trainer_options)
    assert callback.accumulator.num_samples == expected


@pytest.mark.parametrize("prefix", [None, 1, b"val_", ["val_"]])
def test_a_prefix_that_is_not_a_str_is_refused(prefix) -> None:
    with pytest.raises(InvalidTypeError, match="'prefix'.*a str"):
        AccuracyCallback(prefix=prefix)


def test_per_class_keys_name_label_rows() -> None:
    logged = loggable({"r_precision": [0.5, 1.0]}, "v_", [[1, 0], [2, 3]])
    assert logged == {"v_r_precision/1_0": 0.5, "v_r_precision/2_3": 1.0}
    with pytest.raises(InvalidArgumentError, match="2 per-class values.*for 1 labels"):
        loggable({"r_precision": [0.5, 1.0]}, "v_", [7])
