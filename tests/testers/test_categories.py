"""GlobalEmbeddingSpaceTester(category_level=...): metrics recorded per query category."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

INCLUDE = ("precision_at_1", "r_precision")


def _splits() -> tuple[dict[str, TensorDataset], torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    classes = torch.arange(120) % 6
    labels = torch.stack([classes, classes // 2], dim=1)  # column 1: the category
    data = torch.randn(120, 5, generator=generator)
    data[:, 0] += classes.float()
    splits = {
        "test": TensorDataset(data[:50], labels[:50]),
        "train": TensorDataset(data[50:], labels[50:]),
    }
    return splits, data


def _tester(category_level, **options) -> GlobalEmbeddingSpaceTester:
    tester = GlobalEmbeddingSpaceTester(
        **options,
        normalize_embeddings=False,
        dataloader_num_workers=0,
        data_device="cpu",
        progress_bar=False,
        accuracy_calculator=AccuracyCalculator(include=INCLUDE),
    )
    tester.category_level = category_level
    return tester


def test_each_category_is_recorded_as_its_queries_alone():
    splits, data = _splits()
    found = _tester(category_level=1).test(
        splits, 1, torch.nn.Identity(), splits_to_eval=[("test", ["train"])]
    )["test"]
    labels = splits["test"].tensors[1]
    reference_labels = splits["train"].tensors[1][:, 0]
    calc = AccuracyCalculator(include=INCLUDE)
    for category in (0, 1, 2):
        mask = labels[:, 1] == category
        expected = calc.get_accuracy(data[:50][mask], labels[mask, 0], data[50:], reference_labels)
        for name, value in expected.items():
            assert found[f"{name}_category{category}_level0"] == pytest.approx(value)
    overall = calc.get_accuracy(data[:50], labels[:, 0], data[50:], reference_labels)
    assert found["precision_at_1_level0"] == pytest.approx(overall["precision_at_1"])


def test_a_category_level_outside_the_labels_is_refused():
    splits, _ = _splits()
    for level in (2, -1, "1"):
        with pytest.raises(InvalidArgumentError, match="'category_level'.*0 to 1.*Got"):
            _tester(level).test(splits, 1, torch.nn.Identity())


def test_without_a_category_level_the_keys_are_unchanged():
    splits, _ = _splits()
    found = _tester(None).test(splits, 1, torch.nn.Identity(), splits_to_eval=[("test", ["train"])])
    assert sorted(found["test"]) == ["epoch", "precision_at_1_level0", "r_precision_level0"]


@pytest.mark.parametrize(("remap", "keys"), [(False, [5, 7, 9]), (True, [0, 1, 2])])
def test_category_keys_are_the_categories_after_the_label_mapping(remap, keys):
    splits, _ = _splits()
    shifted = {}
    for name, dataset in splits.items():
        data, labels = dataset.tensors
        labels = labels.clone()
        labels[:, 1] = labels[:, 1] * 2 + 5  # categories 5, 7, 9
        shifted[name] = TensorDataset(data, labels)
    every_label = torch.cat([dataset.tensors[1] for dataset in shifted.values()])
    options = {"set_min_label_to_zero": remap, "dataset_labels": every_label if remap else None}
    found = _tester(category_level=1, **options).test(
        shifted, 1, torch.nn.Identity(), splits_to_eval=[("test", ["train"])]
    )["test"]
    recorded = sorted(
        {int(key.split("_category")[1].split("_")[0]) for key in found if "_category" in key}
    )
    assert recorded == keys
