"""2.x's customisation points and small behaviours, exercised with 2.x-style user code.

Each expectation is 2.9.0's documented behaviour, written out plainly here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import SequentialSampler, TensorDataset

from pytorch_metric_learning import testers, trainers
from pytorch_metric_learning.distances import BaseDistance, LpDistance
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.utils import common_functions as c_f


# ---------------------------------------------------------------- distances
class AnyShapeDistance(BaseDistance):
    """2.x's tests/distances/test_custom_check_shape.py, written again."""

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return torch.randn(len(query_emb), len(ref_emb))

    def check_shapes(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None) -> None:
        pass


class NoWideInputs(LpDistance):
    """A stricter check: refuse more than 4 columns."""

    def check_shapes(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None) -> None:
        super().check_shapes(query_emb, ref_emb)
        if query_emb.shape[1] > 4:
            raise ValueError("at most 4 columns")


@pytest.mark.parametrize("shape", [(32, 3, 128), (5, 2, 2, 2), (7, 4)])
def test_an_overridden_check_shapes_accepts_other_shapes(shape: tuple[int, ...]) -> None:
    embeddings = torch.randn(*shape)
    assert AnyShapeDistance()(embeddings).shape == (shape[0], shape[0])
    assert AnyShapeDistance()(embeddings, torch.randn(3, *shape[1:])).shape == (shape[0], 3)


@pytest.mark.parametrize("shape", [(32, 3, 128), (4,), (2, 2, 2)])
def test_the_default_check_shapes_refuses_what_is_not_2d(shape: tuple[int, ...]) -> None:
    with pytest.raises(InvalidArgumentError, match="2-D"):
        LpDistance()(torch.randn(*shape))
    with pytest.raises(InvalidArgumentError, match="2-D"):
        LpDistance().check_shapes(torch.randn(3, 2), torch.randn(*shape))


def test_a_stricter_check_shapes_runs_for_every_call() -> None:
    distance = NoWideInputs()
    assert distance(torch.randn(3, 4)).shape == (3, 3)
    for call in (
        lambda: distance(torch.randn(3, 5)),
        lambda: distance(torch.randn(2, 5), torch.randn(2, 5)),
        lambda: distance.pairwise_distance(torch.randn(2, 5), torch.randn(2, 5)),
    ):
        with pytest.raises(ValueError, match="at most 4 columns"):
            call()


class Recording(BaseDistance):
    """A 2.x-style subclass that records a setting and a statistic."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.margin_value = 0.5
        self.add_to_recordable_attributes(name="margin_value", is_stat=False)
        self.add_to_recordable_attributes(list_of_names=["num_calls"], is_stat=True)

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        self.num_calls = getattr(self, "num_calls", 0) + 1
        return query_emb @ ref_emb.T


def test_add_to_recordable_attributes_with_stats() -> None:
    distance = Recording(collect_stats=True)
    assert distance._record_these == ["p", "power", "margin_value"]
    assert distance._record_these_stats == [
        "initial_avg_query_norm",
        "initial_avg_ref_norm",
        "final_avg_query_norm",
        "final_avg_ref_norm",
        "num_calls",
    ]
    assert distance.margin_value == 0.5  # an existing attribute is kept
    assert distance.num_calls == 0  # a new one starts at 0
    distance(torch.randn(3, 2))
    assert distance.num_calls == 1  # each forward starts from zeroed stats, as in 2.x
    distance(torch.randn(3, 2))
    assert distance.num_calls == 1
    distance.num_calls = 7
    distance.reset_stats()
    assert distance.num_calls == 0
    assert distance.margin_value == 0.5  # settings are not stats


def test_stats_are_not_recorded_without_collect_stats() -> None:
    distance = Recording(collect_stats=False)
    assert distance._record_these == ["p", "power", "margin_value"]
    assert not hasattr(distance, "_record_these_stats")
    assert not hasattr(distance, "num_calls")


def test_the_module_functions_of_c_f() -> None:
    class Holder:
        pass

    holder = Holder()
    c_f.add_to_recordable_attributes(holder, list_of_names=["a", "b", "a"], is_stat=True)
    assert holder._record_these_stats == ["a", "b"]
    holder.a = 3
    c_f.reset_stats(holder)
    assert (holder.a, holder.b) == (0, 0)
    assert c_f.list_of_recordable_attributes_list_names() == [
        "_record_these",
        "_record_these_stats",
    ]
    assert list(c_f.tqdm(range(3), disable=True)) == [0, 1, 2]


# ---------------------------------------------------------------- trainer keys
MODELS = ["trunk", "embedder"]
LOSSES = ["metric_loss"]


def allowed_in_2x(key: str, patterns: list[str]) -> bool:
    """2.x's KeyChecker: the key matches (re.match, from its start) one allowed pattern."""
    return any(re.match(pattern, key) for pattern in patterns)


def parts() -> dict[str, Any]:
    torch.manual_seed(0)
    data, labels = torch.randn(12, 5), torch.arange(12) % 3
    return {
        "trunk": torch.nn.Linear(5, 2),
        "dataset": TensorDataset(data, labels),
    }


def spread(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
    return -torch.pdist(embeddings).mean()


def make(cls: Any = trainers.MetricLossOnly, **kwargs: Any) -> Any:
    p = parts()
    defaults: dict[str, Any] = dict(
        models={"trunk": p["trunk"]},
        optimizers={"trunk_optimizer": torch.optim.SGD(p["trunk"].parameters(), lr=0.1)},
        batch_size=4,
        loss_funcs={"metric_loss": spread},
        dataset=p["dataset"],
        sampler=SequentialSampler(p["dataset"]),
        dataloader_num_workers=0,
    )
    defaults.update(kwargs)
    return cls(**defaults)


KEY_PARTS = st.sampled_from(
    ["trunk", "embedder", "classifier", "metric_loss", "classifier_loss", "foo", "optimizer"]
)
SUFFIXES = st.sampled_from(["_optimizer", "_grad_clipper", "", "_opt", "2"])


@settings(max_examples=40, deadline=None)
@given(stem=KEY_PARTS, suffix=SUFFIXES)
def test_optimizer_and_clipper_keys_follow_2x(stem: str, suffix: str) -> None:
    key = stem + suffix
    trunk = torch.nn.Linear(5, 2)
    optimizers_ok = allowed_in_2x(key, [name + "_optimizer" for name in MODELS + LOSSES])
    clippers_ok = allowed_in_2x(key, [name + "_grad_clipper" for name in MODELS + LOSSES])
    optimizer = torch.optim.SGD(trunk.parameters(), lr=0.1)
    for kwargs, ok in (
        ({"optimizers": {key: optimizer}}, optimizers_ok),
        ({"gradient_clippers": {key: lambda: None}}, clippers_ok),
    ):
        if ok:
            make(**kwargs)
        else:
            with pytest.raises(AssertionError):  # 2.x's error type (also a ValueError here)
                make(**kwargs)


@pytest.mark.parametrize(
    ("cls", "models", "ok"),
    [
        (trainers.MetricLossOnly, ["trunk", "embedder"], True),
        (trainers.MetricLossOnly, ["trunk", "classifier"], False),
        (trainers.TrainWithClassifier, ["trunk", "classifier"], True),
        (trainers.TrainWithClassifier, ["trunk", "head"], False),
    ],
)
def test_model_keys_follow_2x(cls: Any, models: list[str], ok: bool) -> None:
    given_models = {name: torch.nn.Linear(5 if name == "trunk" else 2, 2) for name in models}
    if ok:
        make(cls, models=given_models)
    else:
        with pytest.raises(AssertionError, match="'models'"):
            make(cls, models=given_models)


def test_a_subset_batch_miner_picks_the_rows_trained_on() -> None:
    sizes: list[int] = []

    def first_half(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        assert not embeddings.requires_grad  # 2.x mined without gradients
        return torch.arange(len(labels) // 2)

    def loss(embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        sizes.append(len(embeddings))
        return embeddings.sum()

    trainer = make(
        mining_funcs={"subset_batch_miner": first_half}, loss_funcs={"metric_loss": loss}
    )
    trainer.train(num_epochs=1)
    assert sizes == [2, 2, 2]  # batches of 4, halved
    assert trainer.models["trunk"].training


# ---------------------------------------------------------------- smaller
def test_default_loss_weights_have_total_loss() -> None:
    assert make().loss_weights == {"metric_loss": 1, "total_loss": 1}
    given = make(loss_weights={"metric_loss": 2})
    assert given.loss_weights == {"metric_loss": 2}


def test_train_with_classifier_without_classifier_keeps_both_losses() -> None:
    trainer = make(trainers.TrainWithClassifier)
    trainer.train(num_epochs=1)
    assert set(trainer.losses) == {"metric_loss", "classifier_loss", "total_loss"}


def test_description_suffixes_as_2x() -> None:
    tester = testers.GlobalEmbeddingSpaceTester(pca=8, label_hierarchy_level=[0, 1])
    expected = "val_pca8_normalized_GlobalEmbeddingSpaceTester_level_0_1"
    assert tester.description_suffixes("val") == expected
    plain = testers.GlobalEmbeddingSpaceTester(normalize_embeddings=False, use_trunk_output=True)
    assert plain.description_suffixes("x") == "x_trunk_GlobalEmbeddingSpaceTester_level_0"


def test_tester_default_data_and_label_getter_returns_its_input() -> None:
    getter = testers.GlobalEmbeddingSpaceTester().data_and_label_getter
    batch = (torch.zeros(2, 3), torch.ones(2))
    assert getter(batch) is batch
