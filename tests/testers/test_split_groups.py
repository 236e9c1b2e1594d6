"""Testers pass group ids (``split_groups``) through to the re-identification protocol."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

METRICS = ("precision_at_1", "mean_average_precision")


def _data():
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(20, 4, generator=generator)
    gallery = torch.randn(40, 4, generator=generator)
    query_labels = torch.randint(0, 4, (20,), generator=generator)
    gallery_labels = torch.randint(0, 4, (40,), generator=generator)
    cameras = {
        "query": torch.randint(0, 2, (20,), generator=generator),
        "gallery": torch.randint(0, 2, (40,), generator=generator),
    }
    datasets = {
        "query": torch.utils.data.TensorDataset(query, query_labels),
        "gallery": torch.utils.data.TensorDataset(gallery, gallery_labels),
    }
    return datasets, (query, query_labels, gallery, gallery_labels), cameras


def test_tester_scores_with_the_groups_of_each_split() -> None:
    datasets, (query, query_labels, gallery, gallery_labels), cameras = _data()
    calculator = AccuracyCalculator(include=METRICS, k=None)
    tester = GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        data_device="cpu",
        dataloader_num_workers=0,
        accuracy_calculator=calculator,
        progress_bar=False,
        split_groups=cameras,
    )
    model = torch.nn.Identity()
    found = tester.test(datasets, 0, model, splits_to_eval=[("query", ["gallery"])])
    expected = AccuracyCalculator(include=METRICS, k=None).get_accuracy(
        query,
        query_labels,
        gallery,
        gallery_labels,
        query_groups=cameras["query"],
        reference_groups=cameras["gallery"],
    )
    for name, value in expected.items():
        assert found["query"][f"{name}_level0"] == pytest.approx(value)


def test_missing_split_is_named() -> None:
    datasets, _, cameras = _data()
    tester = GlobalEmbeddingSpaceTester(
        data_device="cpu",
        dataloader_num_workers=0,
        progress_bar=False,
        accuracy_calculator=AccuracyCalculator(include=METRICS),
        split_groups={"query": cameras["query"]},
    )
    with pytest.raises(InvalidArgumentError, match="'split_groups'.*missing \\['gallery'\\]"):
        tester.test(datasets, 0, torch.nn.Identity(), splits_to_eval=[("query", ["gallery"])])


def test_float_groups_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="'split_groups'.*1-D integer group ids"):
        GlobalEmbeddingSpaceTester(split_groups={"query": torch.rand(3)})
