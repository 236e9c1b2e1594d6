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

from pytorch_metric_learning.integrations.lightning import AccuracyCallback  # noqa: E402
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
    trainer = fit(model, [by_index, by_size], epochs=2)
    logged = {{name: float(value) for name, value in trainer.callback_metrics.items()}}
    torch.save(
        {{"rows": model.rows, "by_index": by_index.last_accuracies,
          "by_size": by_size.last_accuracies, "logged": logged}},
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
    received = sum(len(batch["labels"]) for result in ranks for batch in result["rows"])
    assert received == VALIDATION_ROWS + 1  # the sampler repeated one row
    expected = single_process(ranks)
    assert 0.5 < expected["precision_at_1"] < 1.0  # trained, and not trivially
    for result in ranks:
        for name, value in expected.items():
            assert result["by_index"][name] == pytest.approx(value, rel=1e-12, abs=0), name
            assert result["by_size"][name] == pytest.approx(value, rel=1e-12, abs=0), name
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
