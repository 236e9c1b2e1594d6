"""Distances, hooks, trainers, testers and ``c_f`` used as pytorch-metric-learning 2.x's
docs, notebooks and tests use them (issue 37), each result checked against a value
computed here by hand or by a plain loop, or against the documented difference."""

from __future__ import annotations

import copy
import importlib
import logging
import math
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from pytorch_metric_learning import distances, testers, trainers
from pytorch_metric_learning.distances import (
    BaseDistance,
    BatchedDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)
from pytorch_metric_learning.errors import (
    InvalidArgumentError,
    InvalidKeysError,
    NotInThisLibraryError,
)
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN, MatchFinder

# ---------------------------------------------------------------- 1. zero distances


@pytest.mark.parametrize(
    "distance",
    [LpDistance(), LpDistance(power=2), LpDistance(p=1), LpDistance(power=0.5), SNRDistance()],
    ids=repr,
)
def test_a_loss_over_d_x_with_its_diagonal_masked_trains_to_finite_weights(distance) -> None:
    # 2.x's docs: a loss over distance(embeddings), the diagonal (self-pairs) left out;
    # the batch also holds a duplicate input, so one off-diagonal distance is 0 as well.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(6, 4)
    data[5] = data[0]
    labels = torch.tensor([0, 0, 1, 1, 2, 0])
    off_diagonal = ~torch.eye(6, dtype=torch.bool)
    for _ in range(3):
        mat = distance(model(data))
        same = (labels[:, None] == labels[None]) & off_diagonal
        loss = mat[same].mean() - mat[~same & off_diagonal].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------- 2. margin


def test_margin_has_2x_sign() -> None:
    # 2.x: x - y for a distance, y - x for a similarity
    assert LpDistance().margin(1, 3) == -2
    assert SNRDistance().margin(5, 2) == 3
    assert CosineSimilarity().margin(1, 3) == 2
    assert DotProductSimilarity().margin(0.25, 1.0) == 0.75
    d_an, d_ap = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.0])
    # a triplet loss written against 2.x: relu(margin(d_ap, d_an) + 0.2)
    hinge = torch.relu(LpDistance().margin(d_ap, d_an) + 0.2)
    assert hinge.tolist() == pytest.approx([0.0, 0.7])


# ---------------------------------------------------------------- 3. custom distances


class Chebyshev(BaseDistance):
    """Written the way 2.x's docs say: compute_mat and pairwise_distance."""

    def compute_mat(self, query_emb, ref_emb):
        return (query_emb[:, None] - ref_emb[None]).abs().amax(dim=2)

    def pairwise_distance(self, query_emb, ref_emb):
        return (query_emb - ref_emb).abs().amax(dim=1)


class NegativeL1(BaseDistance):
    """A similarity with compute_mat only."""

    def __init__(self, **kwargs):
        super().__init__(is_inverted=True, **kwargs)

    def compute_mat(self, query_emb, ref_emb):
        return -(query_emb[:, None] - ref_emb[None]).abs().sum(dim=2)


def _chebyshev_loop(x: torch.Tensor, y: torch.Tensor) -> list[list[float]]:
    return [[max(abs(a - b) for a, b in zip(row, col)) for col in y.tolist()] for row in x.tolist()]


def test_a_2x_style_custom_distance_works_wherever_a_distance_is_accepted() -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 3.0], [2.0, 2.5], [4.0, 0.0]])
    y = torch.tensor([[0.5, 0.0], [1.0, 1.0], [2.0, 3.0], [4.0, 1.5]])
    distance = Chebyshev(normalize_embeddings=False)
    expected = _chebyshev_loop(x, y)
    assert distance(x, y).tolist() == expected
    diagonal = [expected[i][i] for i in range(4)]  # [0.5, 2.0, 0.5, 1.5]
    assert distance.pairwise_distance(x, y).tolist() == diagonal
    finder = MatchFinder(distance=distance, threshold=1.0)
    assert finder.is_match(x, y).tolist() == [v <= 1.0 for v in diagonal]
    assert finder.get_match_matrix(x, y).tolist() == [[v <= 1.0 for v in r] for r in expected]
    values, indices = CustomKNN(distance)(x, 1, y, False)
    nearest = [min(range(4), key=lambda j: expected[i][j]) for i in range(4)]
    assert indices[:, 0].tolist() == nearest
    assert values[:, 0].tolist() == [expected[i][nearest[i]] for i in range(4)]
    calc = AccuracyCalculator(include=("precision_at_1",), knn_func=CustomKNN(distance))
    labels = torch.tensor([0, 1, 1, 2])
    accuracy = calc.get_accuracy(x, labels, y, labels, False)["precision_at_1"]
    assert accuracy == pytest.approx(
        np.mean([labels[n] == labels[i] for i, n in enumerate(nearest)])
    )
    blocks: list[torch.Tensor] = []
    BatchedDistance(distance, lambda mat, s, e: blocks.append(mat), batch_size=3)(x, y)
    assert torch.cat(blocks).tolist() == expected


def test_a_custom_distance_with_compute_mat_only_has_row_pair_values() -> None:
    x = torch.tensor([[0.0, 1.0], [2.0, 2.0], [3.0, -1.0]])
    y = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    similarity = NegativeL1(normalize_embeddings=False)
    by_loop = [-sum(abs(a - b) for a, b in zip(p, q)) for p, q in zip(x.tolist(), y.tolist())]
    assert similarity.pairwise(x, y).tolist() == by_loop
    assert MatchFinder(similarity, -2.0).is_match(x, y).tolist() == [v >= -2 for v in by_loop]


# ---------------------------------------------------------------- 4. pairwise_distance


def test_pairwise_distance_uses_the_distances_own_settings() -> None:
    # documented difference: 2.x's pairwise_distance compared raw rows
    x, y = torch.tensor([[3.0, 4.0]]), torch.tensor([[6.0, 8.0]])
    assert LpDistance().pairwise_distance(x, y).tolist() == [0.0]  # same direction
    raw = LpDistance(normalize_embeddings=False)
    assert raw.pairwise_distance(x, y).tolist() == [5.0]  # what 2.x returned
    assert LpDistance(normalize_embeddings=False, power=2).pairwise_distance(x, y).tolist() == [
        25.0
    ]


# ---------------------------------------------------------------- 5. collect_stats


def test_collect_stats_is_accepted_and_defaults_to_c_f(monkeypatch) -> None:
    assert c_f.COLLECT_STATS is False
    assert LpDistance(collect_stats=False).collect_stats is False
    assert LpDistance().collect_stats is False
    monkeypatch.setattr(c_f, "COLLECT_STATS", True)  # what 2.x's tests/__init__ does
    distance = LpDistance()
    assert distance.collect_stats is True
    query, ref = torch.tensor([[3.0, 4.0], [0.0, 2.0]]), torch.tensor([[1.0, 0.0]])
    distance(query, ref)
    assert distance.initial_avg_query_norm == pytest.approx((5 + 2) / 2)
    assert distance.initial_avg_ref_norm == pytest.approx(1.0)
    assert distance.final_avg_query_norm == pytest.approx(1.0)
    assert distance.final_avg_ref_norm == pytest.approx(1.0)
    with pytest.raises(TypeError, match="collect_stats"):
        LpDistance(collect_stats="yes")


# ---------------------------------------------------------------- 6. modules


def test_distances_are_modules_with_largest_dist() -> None:
    for distance in (LpDistance(), CosineSimilarity(), SNRDistance(), DotProductSimilarity()):
        assert isinstance(distance, torch.nn.Module)
        assert distance.state_dict() == {}
        assert repr(pickle.loads(pickle.dumps(distance))) == repr(distance)
        assert repr(copy.deepcopy(distance)) == repr(distance)
    values = torch.tensor([[1.0, 3.0, 2.0]])
    assert LpDistance().largest_dist(values, dim=1).values.tolist() == [3.0]
    assert CosineSimilarity().largest_dist(values, dim=1).values.tolist() == [1.0]
    loss = torch.nn.Module()
    loss.distance = LpDistance()  # a child module, as in 2.x's losses
    assert [name for name, _ in loss.named_children()] == ["distance"]


def test_batched_distance_iter_fn_none_then_set() -> None:
    batched = BatchedDistance(LpDistance(), iter_fn=None, batch_size=2)
    assert isinstance(batched, torch.nn.Module)
    with pytest.raises(InvalidArgumentError, match="iter_fn"):
        batched(torch.randn(3, 2))
    minima: list[float] = []
    batched.iter_fn = lambda mat, s, e: minima.extend(mat.min(dim=1).values.tolist())
    points = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    batched(points, points)
    assert minima == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
    assert batched.is_inverted is False


# ---------------------------------------------------------------- 7. c_f


# The 2.x names of c_f that this library provides again (docs/migrating.md lists the rest).
PROVIDED = [
    "COLLECT_STATS",
    "NUMPY_RANDOM",
    "pos_inf",
    "neg_inf",
    "small_val",
    "torch_arange_from_size",
    "set_ref_emb",
    "get_labels_to_indices",
    "safe_random_choice",
    "operate_on_dict_of_models",
    "sqlite_obj_to_dict",
    "TorchInitWrapper",
    "get_train_dataloader",
    "return_input",
    "set_layers_to_eval",
    "set_requires_grad",
    "try_next_on_generator",
]


@pytest.mark.parametrize("name", PROVIDED)
def test_c_f_provides_the_2x_names(name: str) -> None:
    assert name in c_f.__all__
    assert hasattr(c_f, name)


def test_get_labels_to_indices_like_the_inference_notebook() -> None:
    labels = torch.tensor([2, 0, 2, 1, 0, 2])
    mapping = c_f.get_labels_to_indices(labels)
    for label in (0, 1, 2):
        expected = [i for i, value in enumerate(labels.tolist()) if value == label]
        assert mapping[label].tolist() == expected
    assert isinstance(mapping, defaultdict)


def test_small_c_f_helpers() -> None:
    assert c_f.pos_inf(torch.float32) == torch.finfo(torch.float32).max
    assert c_f.neg_inf(torch.float16) == -65504.0
    assert c_f.small_val(torch.float64) == torch.finfo(torch.float64).tiny
    assert c_f.torch_arange_from_size(torch.zeros(2, 5), 1).tolist() == [0, 1, 2, 3, 4]
    emb, labels = torch.zeros(3, 2), torch.tensor([0, 1, 1])
    assert c_f.set_ref_emb(emb, labels, None, None)[0] is emb
    rows = [{"epoch": 1, "p": 0.5}, {"epoch": 2, "p": 0.25}]
    assert c_f.sqlite_obj_to_dict(rows) == {"epoch": [1, 2], "p": [0.5, 0.25]}
    drawn = c_f.safe_random_choice(np.arange(3), 5)  # fewer than asked: with replacement
    assert len(drawn) == 5 and set(drawn.tolist()) <= {0, 1, 2}
    assert sorted(c_f.safe_random_choice(np.arange(4), 4).tolist()) == [0, 1, 2, 3]
    weight = torch.empty(2)
    c_f.TorchInitWrapper(torch.nn.init.constant_, val=3.0)(weight)
    assert weight.tolist() == [3.0, 3.0]
    loader = c_f.get_train_dataloader(TensorDataset(torch.arange(7)), 3, None, 0, None)
    assert sorted(len(batch[0]) for batch in loader) == [3, 3]  # the last partial batch dropped


def test_the_2x_names_that_are_gone_stay_gone() -> None:
    for name in ("shift_indices_tuple", "assert_distance_type", "regex_wrapper", "exclude"):
        assert not hasattr(c_f, name)
    # 2.x's distributed loss and miner wrappers: an ImportError that says why (issue 36)
    with pytest.raises(NotInThisLibraryError, match="DistributedLossWrapper"):
        importlib.import_module("pytorch_metric_learning.utils.distributed")


# ---------------------------------------------------------------- 8. hook histories


class _FixedTester(testers.GlobalEmbeddingSpaceTester):
    """Scores each epoch from a table instead of embedding anything."""

    def __init__(self, accuracies: dict[int, float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scripted = accuracies

    def test(self, dataset_dict, epoch, trunk_model, *args: Any, **kwargs: Any):
        self.all_accuracies = defaultdict(dict)
        self.all_accuracies["val"] = {"epoch": epoch, "precision_at_1_level0": self.scripted[epoch]}
        self.end_of_testing_hook(self)
        return self.all_accuracies


def test_2x_trainer_test_record_counts(tmp_path: Path) -> None:
    # 2.x's test_metric_loss_only: 2 epochs of 10 iterations, log_freq=2 -> 10 loss rows
    num_epochs, iterations_per_epoch, log_freq = 2, 10, 2
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(
        record_keeper, primary_metric="precision_at_1", log_freq=log_freq
    )
    scripted = {1: 0.5, 2: 0.25}
    tester = _FixedTester(scripted, end_of_testing_hook=hooks.end_of_testing_hook)
    val = TensorDataset(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))
    end_of_epoch_hook = hooks.end_of_epoch_hook(tester, {"val": val}, tmp_path / "models")
    trunk = torch.nn.Linear(3, 2)
    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk},
        optimizers={"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.01)},
        batch_size=2,
        loss_funcs={"metric_loss": lambda e, labels, indices: e.pow(2).mean()},
        dataset=TensorDataset(torch.randn(20, 3), torch.arange(20) % 4),
        iterations_per_epoch=iterations_per_epoch,
        dataloader_num_workers=0,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=end_of_epoch_hook,
    )
    trainer.train(num_epochs=num_epochs)
    loss_history = hooks.get_loss_history()
    assert len(loss_history["metric_loss"]) == (iterations_per_epoch / log_freq) * num_epochs
    assert loss_history["~iteration~"] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    best_epoch, best_accuracy = hooks.get_best_epoch_and_accuracy(tester, "val")
    assert (best_epoch, best_accuracy) == (1, 0.5)
    history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
    assert history["best_epoch"] == [1, 1]
    assert history["best_accuracy"] == [0.5, 0.5]
    rows = hooks.get_accuracies_of_epoch(tester, "val", best_epoch)
    assert c_f.sqlite_obj_to_dict(rows)["precision_at_1_level0"] == [best_accuracy]
    assert trainer.losses == {"metric_loss": 0, "total_loss": 0}  # zeroed, as in 2.x


# ---------------------------------------------------------------- 9. train mode


def test_tester_restores_train_mode_and_one_line_gives_2x() -> None:
    trunk = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    trunk.train()
    tester = testers.GlobalEmbeddingSpaceTester(
        dataloader_num_workers=0,
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
    )
    dataset = TensorDataset(torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]))
    tester.test({"val": dataset}, 1, trunk)
    assert trunk.training  # restored (2.x left it in eval mode)
    trunk.eval()  # the one line that gives 2.x's behaviour
    assert not any(m.training for m in trunk.modules())


# ---------------------------------------------------------------- 10. smaller


def _trainer_kwargs(**changes: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "models": {"trunk": torch.nn.Identity()},
        "optimizers": {"trunk_optimizer": None},
        "batch_size": 4,
        "loss_funcs": {"metric_loss": lambda e, labels, indices: e.sum()},
        "mining_funcs": {},
        "dataset": TensorDataset(torch.randn(8, 3), torch.arange(8) % 2),
        "freeze_these": ["trunk"],
        "lr_schedulers": {"trunk_scheduler_by_iteration": None},
    }
    kwargs.update(changes)
    return kwargs


@pytest.mark.parametrize("cls", [trainers.MetricLossOnly, trainers.TrainWithClassifier])
@pytest.mark.parametrize(
    "bad",
    [
        {"models": {}},
        {"mining_funcs": {"dog": None}},
        {"freeze_these": ["frog"]},
        {"lr_schedulers": {"trunk_scheduler": None}},
    ],
    ids=["models", "mining_funcs", "freeze_these", "lr_schedulers"],
)
def test_bad_trainer_keys_raise_assertion_error_as_in_2x(cls, bad) -> None:
    cls(**_trainer_kwargs())  # 2.x's key-checking test builds this first
    with pytest.raises(AssertionError) as caught:
        cls(**_trainer_kwargs(**bad))
    assert isinstance(caught.value, InvalidKeysError)
    assert isinstance(caught.value, ValueError)


def test_train_with_classifier_without_a_classifier_warns_and_trains_the_metric_loss(
    caplog,
) -> None:
    calls: list[int] = []

    def metric_loss(embeddings, labels, indices_tuple):
        calls.append(len(embeddings))
        return embeddings.pow(2).mean()

    trunk = torch.nn.Linear(3, 2)
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        trainer = trainers.TrainWithClassifier(
            models={"trunk": trunk},
            optimizers={"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.1)},
            batch_size=4,
            loss_funcs={"metric_loss": metric_loss},
            dataset=TensorDataset(torch.randn(8, 3), torch.arange(8) % 2),
            dataloader_num_workers=0,
        )
    assert "classifier" in caplog.text
    trainer.train(num_epochs=1)
    assert calls == [4, 4]


def test_all_accuracies_is_a_defaultdict() -> None:
    tester = testers.GlobalEmbeddingSpaceTester(dataloader_num_workers=0)
    assert isinstance(tester.all_accuracies, defaultdict)
    tester.all_accuracies["val"]["epoch"] = 3  # 2.x code writes into it like this
    dataset = TensorDataset(torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]))
    calc = AccuracyCalculator(include=("precision_at_1",))
    tester.accuracy_calculator = calc
    result = tester.test({"val": dataset}, 1, torch.nn.Identity())
    assert isinstance(result, defaultdict)
    assert result["val"]["epoch"] == 1


def test_match_finder_distance_none_until_used() -> None:
    finder = MatchFinder(distance=None, threshold=0.5)
    with pytest.raises(InvalidArgumentError, match="distance"):
        finder.is_match(torch.randn(2, 3), torch.randn(2, 3))
    finder.distance = CosineSimilarity()
    x = torch.tensor([[1.0, 0.0]])
    assert finder.is_match(x, torch.tensor([[1.0, 0.2]])).tolist() == [True]
    assert math.isclose(distances.CosineSimilarity()(x, x).item(), 1.0)
