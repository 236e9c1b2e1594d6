"""LabelMapper: labels to consecutive ints by rank, per hierarchy level."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.testers import LabelMapper


def rank_oracle(all_labels: list, labels: list) -> list[int]:
    ordered = sorted(set(all_labels))
    return [ordered.index(label) for label in labels]


def test_reexported_at_the_2x_path() -> None:
    from pytorch_metric_learning.utils import common_functions

    assert common_functions.LabelMapper is LabelMapper
    assert "LabelMapper" in common_functions.__all__


def test_sparse_ints_become_ranks() -> None:
    mapper = LabelMapper(True, [100, 7, 42, 7])
    assert mapper.map(torch.tensor([42, 100, 7])).tolist() == [1, 2, 0]


def test_strings_become_ranks() -> None:
    mapper = LabelMapper(True, ["dog", "cat", "owl", "cat"])
    mapped = mapper.map(["owl", "cat", "dog"])
    assert mapped.dtype == torch.long
    assert mapped.tolist() == [2, 0, 1]


def test_each_level_of_2d_labels_has_its_own_ranks() -> None:
    dataset_labels = [[50, 9], [10, 9], [30, 1]]
    mapper = LabelMapper(True, dataset_labels)
    assert mapper.map([30, 50], hierarchy_level=0).tolist() == [1, 2]
    assert mapper.map([9, 1], hierarchy_level=1).tolist() == [1, 0]


def test_disabled_mapper_returns_labels_unchanged() -> None:
    labels = torch.tensor([5, 3])
    assert LabelMapper(False, [3, 5]).map(labels) is labels
    assert LabelMapper().map([5, 3]).tolist() == [5, 3]


def test_result_stays_on_the_input_device() -> None:
    labels = torch.tensor([3, 5], device="cpu")
    assert LabelMapper(True, [3, 5]).map(labels).device == labels.device


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=30), st.data())
def test_matches_a_sorted_rank_oracle(all_labels: list[int], data: st.DataObject) -> None:
    labels = data.draw(st.lists(st.sampled_from(all_labels), min_size=1, max_size=20))
    mapped = LabelMapper(True, np.array(all_labels)).map(torch.tensor(labels))
    assert mapped.tolist() == rank_oracle(all_labels, labels)


def test_unknown_label_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown labels \[4\]"):
        LabelMapper(True, [1, 2, 3]).map([1, 4])


def test_label_kind_mismatch_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="same kind"):
        LabelMapper(True, ["a", "b"]).map([1])


def test_level_without_a_map_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="'hierarchy_level'"):
        LabelMapper(True, [1, 2]).map([1], hierarchy_level=1)


def test_set_min_label_to_zero_needs_dataset_labels() -> None:
    with pytest.raises(InvalidArgumentError, match="'dataset_labels' parameter of LabelMapper"):
        LabelMapper(True)


def test_set_min_label_to_zero_must_be_bool() -> None:
    with pytest.raises(InvalidTypeError):
        LabelMapper("yes", [1])
