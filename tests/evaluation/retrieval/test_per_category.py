"""Per-category breakdown: each category equals get_accuracy on its queries alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metric_independence import METRICS

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import AccuracyCalculator

KNN = tuple(METRICS)  # built-in and parametrized metrics whose searched k differs


def _data(num: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (num,), generator=generator)
    x = torch.randn(num, 6, generator=generator, dtype=torch.float64)
    x[:, 0] += labels.double()
    return x, labels


def _alone_self(calc, x, y, mask, **options):
    """The oracle for self-retrieval: the category's queries first in a full reference."""
    reference = torch.cat([x[mask], x[~mask]])
    reference_labels = torch.cat([y[mask], y[~mask]])
    return calc.get_accuracy(
        x[mask], y[mask], reference, reference_labels, ref_includes_query=True, **options
    )


def _assert_same(found: dict, expected: dict) -> None:
    assert list(found) == list(expected)
    for name, value in expected.items():
        got = found[name]
        if isinstance(value, list):
            assert len(got) == len(value)
            for a, b in zip(got, value):
                assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-12)
        elif math.isnan(value):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize("options", [{}, {"avg_of_avgs": True}, {"return_per_class": True}])
def test_self_retrieval_categories_equal_each_category_alone(options):
    x, y = _data(120, 9, seed=0)
    categories = (y % 3) * 10  # classes nest in categories, as SOP's super-categories
    calc = AccuracyCalculator(include=KNN, **options)
    result = calc.get_accuracy(x, y, query_categories=categories)
    assert list(result["per_category"]) == [0, 10, 20]
    for name, found in result["per_category"].items():
        _assert_same(found, _alone_self(calc, x, y, categories == name))
    overall = calc.get_accuracy(x, y)
    _assert_same({k: v for k, v in result.items() if k != "per_category"}, overall)


def test_separate_reference_and_categories_that_cut_across_classes():
    x, y = _data(90, 6, seed=1)
    reference, reference_labels = _data(150, 6, seed=2)
    names = np.array(["chair", "bike", "lamp"])[np.arange(90) % 3].tolist()
    calc = AccuracyCalculator(include=KNN, k=7)
    result = calc.get_accuracy(x, y, reference, reference_labels, query_categories=names)
    assert list(result["per_category"]) == ["bike", "chair", "lamp"]
    for name, found in result["per_category"].items():
        mask = torch.tensor([n == name for n in names])
        expected = calc.get_accuracy(x[mask], y[mask], reference, reference_labels)
        _assert_same(found, expected)


def test_clustering_metrics_are_recomputed_on_each_category():
    x, y = _data(80, 4, seed=3)
    categories = torch.tensor([0, 1]).repeat(40)
    calc = AccuracyCalculator(include=("NMI", "AMI", "precision_at_1"))
    result = calc.get_accuracy(x, y, query_categories=categories)
    for name, found in result["per_category"].items():
        _assert_same(found, _alone_self(calc, x, y, categories == name))


def test_a_category_of_lone_queries_is_nan_and_others_are_unchanged():
    x = torch.randn(6, 3)
    y = torch.tensor([0, 0, 1, 1, 2, 3])  # labels 2 and 3 have no other member
    result = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(
        x, y, query_categories=[0, 0, 0, 0, 1, 1]
    )
    assert math.isnan(result["per_category"][1]["precision_at_1"])
    assert result["per_category"][0]["precision_at_1"] == result["precision_at_1"]


@settings(max_examples=30, deadline=None)
@given(
    num=st.integers(2, 40),
    classes=st.integers(1, 6),
    num_categories=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_property_every_category_equals_its_queries_alone(num, classes, num_categories, seed):
    x, y = _data(num, classes, seed)
    categories = torch.randint(
        0, num_categories, (num,), generator=torch.Generator().manual_seed(seed)
    )
    calc = AccuracyCalculator(include=KNN)
    result = calc.get_accuracy(x, y, query_categories=categories)
    assert sorted(result["per_category"]) == sorted(set(categories.tolist()))
    for name, found in result["per_category"].items():
        _assert_same(found, _alone_self(calc, x, y, categories == name))


def test_return_per_category_false_leaves_the_key_out():
    x, y = _data(20, 3, seed=4)
    calc = AccuracyCalculator(include=("precision_at_1",))
    result = calc.get_accuracy(x, y, query_categories=y, return_per_category=False)
    assert "per_category" not in result


@pytest.mark.parametrize(
    "categories, error, words",
    [
        (None, InvalidArgumentError, "query_categories"),
        (torch.zeros(20), InvalidTypeError, "torch.float32"),
        (torch.zeros(20, 2, dtype=torch.long), InvalidArgumentError, "shape (20, 2)"),
        ([0] * 19, InvalidArgumentError, "19 entries"),
        ([0.5] * 20, InvalidTypeError, "0.5"),
        ([0] * 10 + ["a"] * 10, InvalidTypeError, "mix"),
        ("abc", InvalidTypeError, "str"),
    ],
)
def test_bad_categories_name_the_argument(categories, error, words):
    x, y = _data(20, 3, seed=5)
    calc = AccuracyCalculator(include=("precision_at_1",))
    with pytest.raises(error, match="query_categories") as caught:
        calc.get_accuracy(x, y, query_categories=categories, return_per_category=True)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "convert",
    [
        lambda ints: [np.int64(i) for i in ints],
        lambda ints: list(np.array(ints, dtype=np.int32)),
        lambda ints: [np.str_(f"c{i}") for i in ints],
        lambda ints: np.array([f"c{i}" for i in ints]),
    ],
)
def test_numpy_scalar_categories_give_plain_keys(convert):
    x, y = _data(30, 3, seed=11)
    ints = [i % 4 for i in range(30)]
    calc = AccuracyCalculator(include=("precision_at_1",))
    given_categories = convert(ints)
    keys = list(calc.get_accuracy(x, y, query_categories=given_categories)["per_category"])
    as_ints = isinstance(given_categories[0], np.integer)
    assert keys == sorted({i if as_ints else f"c{i}" for i in ints})
    assert all(type(key) in (int, str) for key in keys)
