"""Evaluation and training code written as pytorch-metric-learning 2.9.0's docs and tests
write it, run unchanged, each result compared with a value computed by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from pytorch_metric_learning import testers, trainers
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.utils import accuracy_calculator
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

# Four points on a line; labels 0, 0, 1, 1. Nearest neighbours (ref_includes_query=True,
# the query itself removed): 0 -> 1, 1 -> 0, 3 -> 2 (label 0: a miss), 10 -> 3.
POINTS = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
LABELS = torch.tensor([0, 0, 1, 1])


class YourCalculator(AccuracyCalculator):
    """The subclass of 2.x's docs/accuracy_calculation.md ("Adding custom accuracy metrics")."""

    def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):
        return accuracy_calculator.precision_at_k(
            knn_labels,
            query_labels[:, None],
            2,
            self.avg_of_avgs,
            self.return_per_class,
            self.label_comparison_fn,
        )

    def calculate_fancy_mutual_info(self, query_labels, cluster_labels, **kwargs):
        return 0

    def requires_clustering(self):
        return super().requires_clustering() + ["fancy_mutual_info"]

    def requires_knn(self):
        return super().requires_knn() + ["precision_at_2"]


def test_custom_metric_subclass_with_positional_get_accuracy() -> None:
    calculator = YourCalculator(include=("precision_at_1", "precision_at_2"), k=2)
    # query, query_labels, reference, reference_labels, ref_includes_query: 2.x's order
    accuracies = calculator.get_accuracy(POINTS, LABELS, POINTS, LABELS, True)
    # two nearest others: 0 -> 1 (distance 1), 3 (distance 3); 1 -> 0, 3; 3 -> 1, 0;
    # 10 -> 3, 1. Same-label counts: 1, 1, 0, 1 of 2.
    assert accuracies["precision_at_1"] == pytest.approx(3 / 4)
    assert accuracies["precision_at_2"] == pytest.approx((1 + 1 + 0 + 1) / 2 / 4)
    assert calculator.get_curr_metrics() == ["precision_at_1", "precision_at_2"]


def _counting_loss(seen: list[Any]) -> Any:
    def loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        seen.append(indices_tuple)
        return embeddings.pow(2).mean()

    return loss


def _training_parts(seen: list[Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    trunk = torch.nn.Linear(3, 2)
    models = {"trunk": trunk}
    optimizers = {"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)}
    return models, optimizers, {"metric_loss": _counting_loss(seen)}


def _miner(embeddings: torch.Tensor, labels: torch.Tensor) -> str:
    return "mined"


def _train_dataset() -> TensorDataset:
    return TensorDataset(
        torch.randn(8, 3, generator=torch.Generator().manual_seed(0)), LABELS.repeat(2)
    )


@pytest.mark.parametrize("miners", ["keyword", "positional", "none"])
def test_trainer_takes_the_dataset_in_2x_position(miners: str) -> None:
    # 2.x: MetricLossOnly(models, optimizers, batch_size, loss_funcs, dataset, mining_funcs=None, ...)
    seen: list[Any] = []
    models, optimizers, loss_funcs = _training_parts(seen)
    dataset = _train_dataset()
    mining_funcs = {"tuple_miner": _miner}
    common = {"sampler": SequentialSampler(dataset), "dataloader_num_workers": 0}
    if miners == "keyword":
        trainer = trainers.MetricLossOnly(
            models, optimizers, 4, loss_funcs, dataset, mining_funcs=mining_funcs, **common
        )
    elif miners == "positional":
        trainer = trainers.MetricLossOnly(
            models, optimizers, 4, loss_funcs, dataset, mining_funcs, **common
        )
    else:
        trainer = trainers.MetricLossOnly(models, optimizers, 4, loss_funcs, dataset, **common)
    trainer.train(num_epochs=1)
    expected = None if miners == "none" else "mined"
    assert seen == [expected, expected]  # 8 samples, batches of 4


def test_trainer_still_takes_miners_then_dataset() -> None:
    seen: list[Any] = []
    models, optimizers, loss_funcs = _training_parts(seen)
    dataset = _train_dataset()
    trainers.MetricLossOnly(
        models,
        optimizers,
        4,
        loss_funcs,
        {"tuple_miner": _miner},
        dataset,
        sampler=SequentialSampler(dataset),
        dataloader_num_workers=0,
    ).train(num_epochs=1)
    assert seen == ["mined", "mined"]


def test_trainer_without_a_dataset_or_with_two_says_so() -> None:
    models, optimizers, loss_funcs = _training_parts([])
    with pytest.raises(InvalidArgumentError, match="'dataset'"):
        trainers.MetricLossOnly(models, optimizers, 4, loss_funcs, {})
    with pytest.raises(TypeError, match="dataset both"):
        trainers.MetricLossOnly(
            models, optimizers, 4, loss_funcs, _train_dataset(), dataset=_train_dataset()
        )


class _ModeRecorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        return x


@pytest.mark.parametrize("eval_mode", [True, False])
def test_get_all_embeddings_with_2x_options(eval_mode: bool) -> None:
    tester = testers.GlobalEmbeddingSpaceTester(
        normalize_embeddings=False, dataloader_num_workers=0, batch_size=4
    )
    trunk = _ModeRecorder()
    embeddings, labels = tester.get_all_embeddings(
        c_f.EmbeddingDataset(POINTS, LABELS), trunk, eval=eval_mode, return_as_numpy=True
    )
    assert isinstance(embeddings, np.ndarray) and isinstance(labels, np.ndarray)
    np.testing.assert_array_equal(embeddings, POINTS.numpy())
    np.testing.assert_array_equal(labels, LABELS.numpy()[:, None])
    assert trunk.modes == [not eval_mode]
    assert trunk.training  # the caller's mode is kept


def test_tester_on_precomputed_embeddings_with_end_of_testing_hook() -> None:
    seen: dict[str, Any] = {}

    def end_of_testing_hook(tester: Any) -> None:
        seen["splits"] = sorted(tester.embeddings_and_labels)
        seen["accuracies"] = dict(tester.all_accuracies["val"])

    tester = testers.GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        dataloader_num_workers=0,
        end_of_testing_hook=end_of_testing_hook,
        accuracy_calculator=YourCalculator(include=("precision_at_1",)),
    )
    dataset = c_f.EmbeddingDataset(POINTS, LABELS)
    accuracies = tester.test({"val": dataset}, 1, torch.nn.Identity())
    assert seen["splits"] == ["val"]
    assert math.isclose(accuracies["val"]["precision_at_1_level0"], 3 / 4)
    assert seen["accuracies"] == accuracies["val"]


class DocsCalculator(AccuracyCalculator):
    """2.x's docs write ``precision_at_k(knn_labels, query_labels[:, None], 2)``."""

    def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):
        return accuracy_calculator.precision_at_k(knn_labels, query_labels[:, None], 2)

    def calculate_mean_first_distance(self, knn_distances, not_lone_query_mask, **kwargs):
        return float(knn_distances[not_lone_query_mask, 0].mean())

    def requires_knn(self):
        return super().requires_knn() + ["precision_at_2", "mean_first_distance"]


def test_docs_custom_metrics_and_their_keyword_arguments() -> None:
    calculator = DocsCalculator(include=("precision_at_2", "mean_first_distance"), k=2)
    accuracies = calculator.get_accuracy(POINTS, LABELS, POINTS, LABELS, ref_includes_query=True)
    assert accuracies["precision_at_2"] == pytest.approx(3 / 8)  # see the test above
    # nearest other point: distances 1, 1, 2, 7 (squared Euclidean: 1, 1, 4, 49)
    assert accuracies["mean_first_distance"] == pytest.approx((1 + 1 + 4 + 49) / 4)


def test_docs_floating_point_labels_with_a_custom_comparison() -> None:
    def label_comparison_fn(x, y):
        return torch.abs(x - y) < 1

    labels = torch.tensor([10.0, 0.03, 0.04, 0.05])
    embeddings = torch.tensor([[0.0], [1.0], [1.5], [1.7]])
    calculator = AccuracyCalculator(exclude=("NMI", "AMI"), label_comparison_fn=label_comparison_fn)
    accuracies = calculator.get_accuracy(embeddings, labels, embeddings, labels, True)
    # 10.0 matches nothing but itself: a lone query, left out. The others match each other,
    # and each one's two nearest others are the other two: every metric is 1.
    assert accuracies == {
        "mean_average_precision_at_r": 1.0,
        "precision_at_1": 1.0,
        "r_precision": 1.0,
    }
    # query 1.0 alone against 0 and 1.5 with labels 10.0 and 0.04: the first is 1.5 (0.25 < 1)
    accuracies = calculator.get_accuracy(
        embeddings[1:2], labels[1:2], embeddings[[0, 2]], labels[[0, 2]], False
    )
    assert accuracies["precision_at_1"] == 1.0


def test_train_with_classifier_as_2x_notebooks_build_it() -> None:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=generator), LABELS.repeat(2)
    trunk, embedder, classifier = (
        torch.nn.Linear(3, 3),
        torch.nn.Linear(3, 2),
        torch.nn.Linear(2, 2),
    )
    models = {"trunk": trunk, "embedder": embedder, "classifier": classifier}
    optimizers = {  # lr=0: the models stay as they are, so the losses can be recomputed
        f"{name}_optimizer": torch.optim.SGD(model.parameters(), lr=0.0)
        for name, model in models.items()
    }

    def metric_loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> Any:
        return embeddings.pow(2).sum()

    loss_funcs = {"metric_loss": metric_loss, "classifier_loss": torch.nn.CrossEntropyLoss()}
    recorded: list[dict[str, float]] = []
    dataset = TensorDataset(x, y)
    trainer = trainers.TrainWithClassifier(
        models,
        optimizers,
        4,
        loss_funcs,
        dataset,
        mining_funcs={},
        sampler=SequentialSampler(dataset),
        dataloader_num_workers=0,
        loss_weights={"metric_loss": 1, "classifier_loss": 0.5},
        end_of_iteration_hook=lambda t: recorded.append(dict(t.losses)),
    )
    trainer.train(num_epochs=1)
    with torch.no_grad():
        for batch, losses in zip((slice(0, 4), slice(4, 8)), recorded):
            embeddings = embedder(trunk(x[batch]))
            expected_ce = torch.nn.functional.cross_entropy(classifier(embeddings), y[batch])
            expected_metric = embeddings.pow(2).sum()
            assert losses["classifier_loss"] == pytest.approx(float(expected_ce), rel=1e-6)
            assert losses["metric_loss"] == pytest.approx(float(expected_metric), rel=1e-6)
            expected_total = float(expected_metric) + 0.5 * float(expected_ce)
            assert losses["total_loss"] == pytest.approx(expected_total, rel=1e-6)
    assert len(recorded) == 2


def test_train_with_classifier_needs_a_loss_to_train() -> None:
    # no classifier and no metric loss: nothing would be trained (2.x trained nothing)
    models, optimizers, _ = _training_parts([])
    with pytest.raises(AssertionError, match='"classifier"'):
        trainers.TrainWithClassifier(
            models,
            optimizers,
            4,
            {"classifier_loss": torch.nn.CrossEntropyLoss()},
            _train_dataset(),
        )


def test_train_with_classifier_skips_a_loss_weighted_zero() -> None:
    trunk, classifier = torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)
    calls: list[str] = []

    def metric_loss(embeddings, labels, indices_tuple):
        calls.append("metric")
        return embeddings.sum()

    def classifier_loss(logits, labels):
        calls.append("classifier")
        return torch.nn.functional.cross_entropy(logits, labels)

    trainer = trainers.TrainWithClassifier(
        {"trunk": trunk, "classifier": classifier},
        {
            "trunk_optimizer": torch.optim.SGD(
                [*trunk.parameters(), *classifier.parameters()], lr=0.1
            )
        },
        4,
        {"metric_loss": metric_loss, "classifier_loss": classifier_loss},
        _train_dataset(),
        loss_weights={"metric_loss": 0, "classifier_loss": 1},
        dataloader_num_workers=0,
    )
    trainer.train(num_epochs=1)
    assert calls == ["classifier", "classifier"]
    assert sorted(trainer.losses) == [
        "classifier_loss",
        "metric_loss",
        "total_loss",
    ]  # 2.x keeps both
