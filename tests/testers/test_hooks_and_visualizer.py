"""end_of_testing_hook, the embeddings it sees and their release, the visualizer hook."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tester_helpers import SpyCalculator, embed_by_hand, make_model, make_split, quiet

from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester


def datasets() -> dict:
    return {"train": make_split(8, seed=1), "val": make_split(6, seed=2)}


def test_hook_is_called_once_after_all_splits_and_sees_the_embeddings() -> None:
    seen = []
    model = make_model()
    data = datasets()

    def hook(tester) -> None:
        seen.append(
            {
                "accuracies": {k: dict(v) for k, v in tester.all_accuracies.items()},
                "embeddings": {k: v[0].clone() for k, v in tester.embeddings_and_labels.items()},
                "labels": {k: v[1].clone() for k, v in tester.embeddings_and_labels.items()},
            }
        )

    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=SpyCalculator(), end_of_testing_hook=hook, **quiet()
    )
    tester.test(data, 5, model)
    assert len(seen) == 1
    assert list(seen[0]["accuracies"]) == ["train", "val"]
    for name, split in data.items():
        torch.testing.assert_close(
            seen[0]["embeddings"][name], embed_by_hand(model, split.tensors[0])
        )
        assert torch.equal(seen[0]["labels"][name][:, 0], split.tensors[1])


def test_embeddings_are_released_after_test() -> None:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=SpyCalculator(), **quiet())
    tester.test(datasets(), 1, make_model())
    assert not hasattr(tester, "embeddings_and_labels")


def test_embeddings_are_released_when_scoring_fails() -> None:
    class Failing(SpyCalculator):
        def get_accuracy(self, *args, **kwargs):
            raise RuntimeError("calculator failed")

    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=Failing(), **quiet())
    with pytest.raises(RuntimeError, match="calculator failed"):
        tester.test(datasets(), 1, make_model())
    assert not hasattr(tester, "embeddings_and_labels")


def test_training_mode_is_restored_after_test() -> None:
    trunk, embedder = make_model(5, 4), make_model(4, 3)
    trunk.train()
    embedder.eval()
    GlobalEmbeddingSpaceTester(accuracy_calculator=SpyCalculator(), **quiet()).test(
        datasets(), 1, trunk, embedder
    )
    assert trunk.training and not embedder.training


def test_without_a_hook_the_accuracies_are_logged(caplog) -> None:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=SpyCalculator(), **quiet())
    with caplog.at_level(logging.INFO, logger="pytorch_metric_learning"):
        tester.test(datasets(), 7, make_model())
    assert "precision_at_1_level0" in caplog.text and "epoch 7" in caplog.text


class FirstTwoColumns:
    """A stand-in for UMAP: keeps the first two coordinates."""

    def __init__(self) -> None:
        self.inputs: list[np.ndarray] = []

    def fit_transform(self, x: np.ndarray) -> np.ndarray:
        self.inputs.append(x)
        return x[:, :2]


def test_visualizer_output_reaches_the_hook_for_each_query_split_and_level() -> None:
    calls = []
    visualizer = FirstTwoColumns()
    model = make_model()
    data = datasets()

    def visualizer_hook(vis, points, labels, split_name, keyname, epoch) -> None:
        calls.append((vis, points, labels, split_name, keyname, epoch))

    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=SpyCalculator(),
        visualizer=visualizer,
        visualizer_hook=visualizer_hook,
        **quiet(),
    )
    tester.test(data, 3, model, splits_to_eval=[("val", ["train"])])
    ((vis, points, labels, split_name, keyname, epoch),) = calls
    expected = embed_by_hand(model, data["val"].tensors[0]).numpy()
    assert vis is visualizer and split_name == "val" and epoch == 3
    assert keyname == "FirstTwoColumns_level0"
    np.testing.assert_allclose(points, expected[:, :2], rtol=1e-6)
    np.testing.assert_array_equal(labels, data["val"].tensors[1].numpy())
