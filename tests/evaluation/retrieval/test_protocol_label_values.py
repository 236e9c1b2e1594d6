"""Junk/distractor labels are compared exactly; group ids and ``cmc_curve`` errors are named.

The oracle for the label classes is plain Python equality: a reference is junk (or a
distractor) when its label *equals* one of the given values, nothing else. A value no label
of the labels' dtype can equal (1.5 against integers, 257 against uint8, 2**64) matches
nothing, so the result equals the call without it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator, cmc_curve
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

METRICS = ("precision_at_1", "recall_at_2", "mean_average_precision")
DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

QUERY = torch.tensor([[0.0], [1.0], [2.0]])
REFERENCE = torch.tensor([[0.1], [0.2], [1.1], [1.2], [2.1], [2.2]])
QUERY_LABELS = [1, 2, 3]
REFERENCE_LABELS = [1, 2, 2, 3, 3, 1]


def _accuracy(dtype: torch.dtype, **kwargs):
    calculator = AccuracyCalculator(include=METRICS, k=None)
    return calculator.get_accuracy(
        QUERY,
        torch.tensor(QUERY_LABELS, dtype=dtype),
        REFERENCE,
        torch.tensor(REFERENCE_LABELS, dtype=dtype),
        **kwargs,
    )


def _exact_members(values) -> list[int]:
    """The labels present in the data that equal one of ``values`` (plain equality)."""
    return [label for label in set(REFERENCE_LABELS) if any(label == v for v in values)]


unlike_any_label = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: not float(v).is_integer()),
    st.floats(min_value=1.5, max_value=3.5).filter(lambda v: not float(v).is_integer()),
    st.sampled_from([2**64, -(2**64) - 1, 2**63, 257, 256 + 1, 256 + 2, 10**30, -129]),
    st.sampled_from([float("inf"), float("-inf"), float("nan")]),
)


@settings(max_examples=60, deadline=None)
@given(
    extra=st.lists(unlike_any_label, min_size=1, max_size=3),
    real=st.lists(st.sampled_from([1, 2, 3]), max_size=1),
    dtype=st.sampled_from(DTYPES),
    param=st.sampled_from(["junk_labels", "distractor_labels"]),
)
def test_values_no_label_can_equal_match_nothing(extra, real, dtype, param) -> None:
    if any(_fits_plainly(v, dtype) for v in extra):
        return  # e.g. 257 against int16 is a real (absent) label: covered by equality anyway
    expected = _accuracy(dtype, **{param: real}) if real else _accuracy(dtype)
    found = _accuracy(dtype, **{param: real + extra})
    assert found == pytest.approx(expected, nan_ok=True)


def _fits_plainly(value, dtype) -> bool:
    info = torch.iinfo(dtype)
    return value == value and float(value).is_integer() and info.min <= value <= info.max


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("param", ["junk_labels", "distractor_labels"])
def test_fractional_value_is_not_truncated_onto_a_real_label(dtype, param) -> None:
    # 1.5 would truncate to label 1; it must match nothing (no such label)
    assert _exact_members([1.5]) == []
    assert _accuracy(dtype, **{param: [1.5]}) == pytest.approx(_accuracy(dtype))
    assert _accuracy(dtype, **{param: [1.0]}) == pytest.approx(_accuracy(dtype, **{param: [1]}))
    assert _accuracy(dtype, **{param: [1]}) != pytest.approx(_accuracy(dtype))


@pytest.mark.parametrize("param", ["junk_labels", "distractor_labels"])
@pytest.mark.parametrize(
    "container",
    [list, tuple, torch.tensor, np.array, lambda v: np.array(v, dtype=np.int16)],
    ids=["list", "tuple", "tensor", "numpy", "numpy-int16"],
)
def test_every_container_gives_the_same_result(param, container) -> None:
    expected = _accuracy(torch.int64, **{param: [2]})
    assert _accuracy(torch.int64, **{param: container([2])}) == pytest.approx(expected)
    assert expected != pytest.approx(_accuracy(torch.int64))


def test_numpy_integer_items_in_a_list_are_accepted() -> None:
    expected = _accuracy(torch.int64, junk_labels=[2])
    assert _accuracy(torch.int64, junk_labels=[np.int64(2)]) == pytest.approx(expected)


@pytest.mark.parametrize("param", ["junk_labels", "distractor_labels"])
@pytest.mark.parametrize(
    "value",
    [torch.tensor([True]), np.array([True]), [True], ["a"], np.array(["a"]), torch.ones(1, 1)],
    ids=["bool-tensor", "bool-numpy", "bool-list", "str-list", "str-numpy", "2-D"],
)
def test_non_numeric_labels_are_refused_by_name(param, value) -> None:
    with pytest.raises(TypeError, match=f"'{param}'"):
        _accuracy(torch.int64, **{param: value})


@pytest.mark.parametrize(
    "groups",
    [["cam_a", "cam_b", "cam_c"], np.array(["a", "b", "c"]), [[0], [1], [2]], [0.5, 1.0, 2.0]],
    ids=["str-list", "str-numpy", "2-D", "float"],
)
def test_get_accuracy_refuses_bad_groups_by_name(groups) -> None:
    with pytest.raises((InvalidArgumentError, TypeError), match="'query_groups'"):
        _accuracy(torch.int64, query_groups=groups, reference_groups=[0] * 6)


@pytest.mark.parametrize(
    "groups",
    [["cam_a", "cam_b", "cam_c"], np.array(["a", "b", "c"]), [[0], [1], [2]], [True, False, True]],
    ids=["str-list", "str-numpy", "2-D", "bool"],
)
def test_tester_refuses_bad_split_groups_by_name(groups) -> None:
    with pytest.raises((InvalidArgumentError, TypeError), match="'split_groups'.*integer group"):
        GlobalEmbeddingSpaceTester(split_groups={"query": groups})


def test_tester_accepts_integer_split_groups_of_any_container() -> None:
    for groups in ([0, 1, 2], (0, 1, 2), np.array([0, 1, 2]), torch.tensor([0, 1, 2])):
        tester = GlobalEmbeddingSpaceTester(split_groups={"query": groups})
        assert tester.split_groups is not None
        assert tester.split_groups["query"].tolist() == [0, 1, 2]


def test_cmc_curve_error_says_what_bounds_the_ranks_and_how_to_get_more() -> None:
    calculator = AccuracyCalculator(include=("recall_at_2",))  # k is None
    points = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    labels = torch.tensor([0, 1, 1, 0])
    result = calculator.get_accuracy(points, labels, return_per_query=True)
    with pytest.raises(InvalidArgumentError) as caught:
        cmc_curve(result["per_query"], 3)
    message = str(caught.value)
    assert "k >=" not in message
    assert "metrics requested decide" in message
    assert "recall_at_3" in message
    # following the advice works: the curve up to 3 is then the recall_at_r values
    advised = AccuracyCalculator(include=("recall_at_1", "recall_at_2", "recall_at_3"))
    found = advised.get_accuracy(points, labels, return_per_query=True)
    curve = cmc_curve(found["per_query"], 3).tolist()
    assert curve == pytest.approx([found[f"recall_at_{r}"] for r in (1, 2, 3)])


def _pairs_accuracy(pairs):
    calculator = AccuracyCalculator(include=METRICS, k=None)
    return calculator.get_accuracy(
        QUERY,
        torch.tensor(QUERY_LABELS),
        REFERENCE,
        torch.tensor(REFERENCE_LABELS),
        excluded_pairs=pairs,
    )


@pytest.mark.parametrize(
    "container",
    [torch.tensor, np.array, lambda v: np.array(v, dtype=np.int32), list, tuple],
    ids=["tensor", "numpy", "numpy-int32", "list", "tuple"],
)
def test_excluded_pairs_in_any_container_give_the_same_result(container) -> None:
    pairs = [[0, 0], [1, 2]]
    expected = _pairs_accuracy(torch.tensor(pairs))
    assert _pairs_accuracy(container(pairs)) == pytest.approx(expected)
    assert expected != pytest.approx(_pairs_accuracy(None))


@pytest.mark.parametrize(
    "empty", [[], (), np.zeros((0, 2), dtype=np.int64), torch.zeros(0, 2, dtype=torch.long)]
)
def test_no_excluded_pairs_equals_none(empty) -> None:
    assert _pairs_accuracy(empty) == pytest.approx(_pairs_accuracy(None))


@pytest.mark.parametrize(
    ("pairs", "error", "message"),
    [
        (torch.ones(2, 2, dtype=torch.bool), TypeError, "'excluded_pairs'.*bool"),
        (np.ones((2, 2), dtype=bool), TypeError, "'excluded_pairs'.*bool"),
        (torch.tensor([[0, 6]]), InvalidArgumentError, "'excluded_pairs'.*reference row"),
        (torch.tensor([[3, 0]]), InvalidArgumentError, "'excluded_pairs'.*query row"),
        (torch.tensor([[-1, 0]]), InvalidArgumentError, "'excluded_pairs'.*query row"),
        (torch.tensor([[0.0, 1.0]]), InvalidArgumentError, "'excluded_pairs'.*\\(m, 2\\)"),
        (torch.tensor([0, 1]), InvalidArgumentError, "'excluded_pairs'.*\\(m, 2\\)"),
        ("01", TypeError, "'excluded_pairs'"),
        ([["a", "b"]], TypeError, "'excluded_pairs'"),
    ],
)
def test_bad_excluded_pairs_are_named_as_get_accuracy_names_them(pairs, error, message) -> None:
    with pytest.raises(error, match=message) as caught:
        _pairs_accuracy(pairs)
    assert "'pairs' parameter" not in str(caught.value)
