"""splits_to_eval: which query is scored against which reference, checked with a spy."""

from __future__ import annotations

import copy

import pytest
import torch
from tester_helpers import (
    CountingDataset,
    SpyCalculator,
    embed_by_hand,
    make_model,
    make_split,
    quiet,
)

from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

SIZES = {"train": 9, "val": 6, "test": 5}


@pytest.fixture
def datasets() -> dict[str, CountingDataset]:
    splits = {name: make_split(size, seed=i) for i, (name, size) in enumerate(SIZES.items())}
    return {name: CountingDataset(*split.tensors) for name, split in splits.items()}


@pytest.fixture
def model() -> torch.nn.Linear:
    return make_model()


def by_hand(
    model: torch.nn.Module, datasets: dict, *names: str
) -> tuple[torch.Tensor, torch.Tensor]:
    embeddings = torch.cat([embed_by_hand(model, datasets[name].data) for name in names])
    labels = torch.cat([datasets[name].labels for name in names])
    return embeddings, labels


def run(spy: SpyCalculator, datasets: dict, model: torch.nn.Module, splits_to_eval=None) -> dict:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=spy, batch_size=4, **quiet())
    return tester.test(datasets, 3, model, splits_to_eval=splits_to_eval)


def assert_call(call: dict, query, reference, ref_includes_query: bool) -> None:
    torch.testing.assert_close(call["query"], query[0])
    assert torch.equal(call["query_labels"], query[1])
    torch.testing.assert_close(call["reference"], reference[0])
    assert torch.equal(call["reference_labels"], reference[1])
    assert call["ref_includes_query"] is ref_includes_query


def test_default_every_split_queries_itself(spy, datasets, model) -> None:
    accuracies = run(spy, datasets, model)
    assert list(accuracies) == ["train", "val", "test"]
    for call, name in zip(spy.calls, ["train", "val", "test"]):
        split = by_hand(model, datasets, name)
        assert_call(call, split, split, True)


def test_query_against_another_split(spy, datasets, model) -> None:
    accuracies = run(spy, datasets, model, [("test", ["train"])])
    assert list(accuracies) == ["test"]
    (call,) = spy.calls
    assert_call(call, by_hand(model, datasets, "test"), by_hand(model, datasets, "train"), False)


def test_reference_is_the_concatenation_of_splits_in_order(spy, datasets, model) -> None:
    run(spy, datasets, model, [("test", ["train", "val"])])
    (call,) = spy.calls
    expected_reference = by_hand(model, datasets, "train", "val")
    assert_call(call, by_hand(model, datasets, "test"), expected_reference, False)


@pytest.mark.parametrize("references", [["test", "train"], ["train", "test"]])
def test_query_is_moved_to_the_front_of_its_references(spy, datasets, model, references) -> None:
    run(spy, datasets, model, [("test", references)])
    (call,) = spy.calls
    expected_reference = by_hand(model, datasets, "test", "train")
    assert_call(call, by_hand(model, datasets, "test"), expected_reference, True)
    assert torch.equal(call["reference"][: SIZES["test"]], call["query"])


def test_query_in_the_middle_of_three_references(spy, datasets, model) -> None:
    run(spy, datasets, model, [("val", ["train", "val", "test"])])
    (call,) = spy.calls
    expected = by_hand(model, datasets, "val", "train", "test")
    assert_call(call, by_hand(model, datasets, "val"), expected, True)


def test_several_evaluations_in_one_call(spy, datasets, model) -> None:
    accuracies = run(spy, datasets, model, [("val", ["val"]), ("test", ["train"])])
    assert list(accuracies) == ["val", "test"]
    assert [len(call["query"]) for call in spy.calls] == [SIZES["val"], SIZES["test"]]
    assert [len(call["reference"]) for call in spy.calls] == [SIZES["val"], SIZES["train"]]


def test_each_split_is_embedded_exactly_once(spy, datasets, model) -> None:
    run(spy, datasets, model, [("val", ["val", "train"]), ("train", ["val", "train"])])
    assert datasets["val"].reads == SIZES["val"]
    assert datasets["train"].reads == SIZES["train"]
    assert datasets["test"].reads == 0


def test_the_callers_list_is_not_mutated(spy, datasets, model) -> None:
    splits_to_eval = [("test", ["train", "test"]), ("val", ("train", "val"))]
    before = copy.deepcopy(splits_to_eval)
    run(spy, datasets, model, splits_to_eval)
    assert splits_to_eval == before


def test_a_query_split_may_appear_only_once(spy, datasets, model) -> None:
    with pytest.raises(ValueError, match="'test' only once"):
        run(spy, datasets, model, [("test", ["train"]), ("test", ["val"])])
    assert datasets["train"].reads == 0, "checked before any forward pass"


def test_duplicate_references_are_an_error(spy, datasets, model) -> None:
    with pytest.raises(ValueError, match="without duplicate references"):
        run(spy, datasets, model, [("test", ["train", "train"])])


@pytest.mark.parametrize("entry", [("nope", ["train"]), ("test", ["train", "nope"])])
def test_unknown_split_names_are_an_error(spy, datasets, model, entry) -> None:
    with pytest.raises(ValueError, match=r"'nope'.*\['train', 'val', 'test'\]"):
        run(spy, datasets, model, [entry])


@pytest.mark.parametrize(
    ("splits_to_eval", "error"),
    [
        ([("test",)], TypeError),
        (["test"], TypeError),
        ([("test", "train")], TypeError),
        ("test", TypeError),
        ([("test", [])], ValueError),
    ],
)
def test_malformed_entries_are_errors(spy, datasets, model, splits_to_eval, error) -> None:
    with pytest.raises(error, match="'splits_to_eval' parameter of GlobalEmbeddingSpaceTester"):
        run(spy, datasets, model, splits_to_eval)
