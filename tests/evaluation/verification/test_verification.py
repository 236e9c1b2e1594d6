"""Operating-point metrics, the equal error rate, the curve and k-fold evaluation."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from _threshold_oracle import (
    as_tensor,
    candidate_counts,
    candidate_threshold,
    count,
    decide,
    distinct_strongest_first,
    divide,
    oracle_selection,
    py_accuracy,
    validation_pairs,
)
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import roc_curve

from pytorch_metric_learning.evaluation import (
    FoldEvaluation,
    KFoldEvaluation,
    MatchCounts,
    ThresholdCurve,
    equal_error_rate,
    false_match_rate_at_recall,
    kfold_threshold_evaluation,
    match_accuracy,
    match_f1,
    recall_at_false_match_rate,
    select_threshold,
    threshold_curve,
)
from pytorch_metric_learning.evaluation.verification import operating_points as verification

# ---- the curve --------------------------------------------------------------------------


@given(validation_pairs(), st.booleans())
def test_curve_matches_oracle(pairs, is_inverted) -> None:
    scores, labels, dtype_name = pairs
    curve = threshold_curve(
        as_tensor(scores, dtype_name), torch.tensor(labels), is_inverted=is_inverted
    )
    assert isinstance(curve, ThresholdCurve) and isinstance(curve.counts, MatchCounts)
    assert curve.thresholds.dtype == torch.float64 and curve.thresholds.device.type == "cpu"
    distinct = distinct_strongest_first(scores, is_inverted)
    expected = [
        candidate_threshold(distinct, j, dtype_name, is_inverted) for j in range(len(distinct) + 1)
    ]
    assert curve.thresholds.tolist() == expected
    got_counts = list(zip(*(field.tolist() for field in curve.counts)))
    assert got_counts == [
        tuple(map(float, c)) for c in candidate_counts(scores, labels, is_inverted)
    ]
    tensor = as_tensor(scores, dtype_name)
    for threshold, counts in zip(curve.thresholds.tolist(), got_counts):
        matched = tensor >= threshold if is_inverted else tensor <= threshold
        assert count(scores, labels, matched.tolist()) == counts


def test_curve_gives_scikit_learn_roc_points() -> None:
    generator = np.random.default_rng(5)
    scores = np.round(generator.standard_normal(300), 1)
    labels = generator.random(300) < 1 / (1 + np.exp(-2 * scores))
    for is_inverted in (True, False):
        curve = threshold_curve(scores, labels, is_inverted=is_inverted)
        tp, fp, tn, fn = (field.numpy() for field in curve.counts)
        oriented = scores if is_inverted else -scores
        fpr, tpr, _ = roc_curve(labels, oriented, drop_intermediate=False)
        np.testing.assert_allclose(fp / (fp + tn), fpr, rtol=0, atol=1e-15)
        np.testing.assert_allclose(tp / (tp + fn), tpr, rtol=0, atol=1e-15)


def test_selected_threshold_is_on_the_curve() -> None:
    generator = torch.Generator().manual_seed(2)
    scores = torch.randn(100, generator=generator)
    labels = torch.rand(100, generator=generator) < torch.sigmoid(3 * scores)
    curve = threshold_curve(scores, labels, is_inverted=True)
    selection = select_threshold(scores, labels, match_f1, is_inverted=True)
    index = int(torch.argmax(match_f1(curve.counts)))
    assert curve.thresholds[index].item() == selection.threshold


# ---- operating-point metrics --------------------------------------------------------------


def py_recall_at_fmr(rate):
    def metric(tp, fp, tn, fn):
        return divide(tp, tp + fn) if divide(fp, fp + tn) <= rate else math.nan

    return metric


@given(validation_pairs(dtype_names=("float32", "float64")), st.booleans(), st.integers(0, 10))
def test_recall_at_false_match_rate_matches_oracle(pairs, is_inverted, tenths) -> None:
    scores, labels, dtype_name = pairs
    rate = tenths / 10
    metric = recall_at_false_match_rate(rate)
    counts = candidate_counts(scores, labels, is_inverted)
    curve = threshold_curve(
        as_tensor(scores, dtype_name), torch.tensor(labels), is_inverted=is_inverted
    )
    values = metric(curve.counts).tolist()
    expected = [py_recall_at_fmr(rate)(*c) for c in counts]
    assert [None if math.isnan(v) else v for v in values] == [
        None if math.isnan(v) else v for v in expected
    ]
    selection = select_threshold(
        as_tensor(scores, dtype_name), torch.tensor(labels), metric, is_inverted=is_inverted
    )
    oracle = oracle_selection(scores, labels, py_recall_at_fmr(rate), dtype_name, is_inverted)
    assert selection == oracle
    # the highest recall among all thresholds whose false match rate is at most the rate
    feasible = [divide(tp, tp + fn) for tp, fp, tn, fn in counts if fp / (fp + tn) <= rate]
    assert selection.value == max(feasible)


@given(validation_pairs(dtype_names=("float32", "float64")), st.booleans(), st.integers(0, 10))
def test_false_match_rate_at_recall_matches_oracle(pairs, is_inverted, tenths) -> None:
    scores, labels, dtype_name = pairs
    target = tenths / 10
    counts = candidate_counts(scores, labels, is_inverted)
    selection = select_threshold(
        as_tensor(scores, dtype_name),
        torch.tensor(labels),
        false_match_rate_at_recall(target),
        is_inverted=is_inverted,
    )
    # the lowest false match rate among thresholds with recall at least the target,
    # at the strictest such threshold
    feasible = [j for j, (tp, fp, tn, fn) in enumerate(counts) if tp / (tp + fn) >= target]
    best = min(feasible, key=lambda j: (counts[j][1] / (counts[j][1] + counts[j][2]), j))
    tp, fp, tn, fn = counts[best]
    distinct = distinct_strongest_first(scores, is_inverted)
    assert selection == (
        candidate_threshold(distinct, best, dtype_name, is_inverted),
        fp / (fp + tn),
    )


def test_operating_point_metrics_are_nan_where_the_target_is_not_met() -> None:
    counts = MatchCounts(
        *torch.tensor(
            [
                [0.0, 2.0, 3.0, 4.0],
                [0.0, 0.0, 5.0, 10.0],
                [10.0, 10.0, 5.0, 0.0],
                [4.0, 2.0, 1.0, 0.0],
            ],
            dtype=torch.float64,
        )
    )
    # false match rates 0, 0, 0.5, 1; recalls 0, 0.5, 0.75, 1
    at_fmr = recall_at_false_match_rate(0.4)(counts)
    assert at_fmr[:2].tolist() == [0.0, 0.5] and at_fmr[2:].isnan().all()
    at_recall = false_match_rate_at_recall(0.7)(counts)
    assert at_recall[2].item() == 0.5
    assert at_recall[[0, 1, 3]].isnan().all()
    unreachable = false_match_rate_at_recall(0.7)(MatchCounts(*(t[:2] for t in counts)))
    assert unreachable.isnan().all()


@pytest.mark.parametrize("factory", [recall_at_false_match_rate, false_match_rate_at_recall])
@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_operating_point_targets_are_validated(factory, bad) -> None:
    with pytest.raises(ValueError):
        factory(bad)


@pytest.mark.parametrize("factory", [recall_at_false_match_rate, false_match_rate_at_recall])
def test_operating_point_target_type(factory) -> None:
    with pytest.raises(TypeError):
        factory("0.1")
    assert "0.25" in repr(factory(0.25))


# ---- equal error rate ---------------------------------------------------------------------


def oracle_equal_error_rate(scores, labels, is_inverted) -> float:
    """Walk the (false match rate, false non-match rate) points; intersect the segment."""
    points = []
    for tp, fp, tn, fn in candidate_counts(scores, labels, is_inverted):
        points.append((fp / (fp + tn), fn / (fn + tp)))
    for (fmr0, fnmr0), (fmr1, fnmr1) in zip(points, points[1:]):
        if fmr1 - fnmr1 >= 0:
            gap0, gap1 = fmr0 - fnmr0, fmr1 - fnmr1
            if gap1 == 0:
                return fmr1
            weight = -gap0 / (gap1 - gap0)
            return fmr0 + weight * (fmr1 - fmr0)
    raise AssertionError("the false match rate reaches 1 at the last point")


@given(validation_pairs(dtype_names=("float32", "float64")), st.booleans())
def test_equal_error_rate_matches_oracle(pairs, is_inverted) -> None:
    scores, labels, dtype_name = pairs
    got = equal_error_rate(
        as_tensor(scores, dtype_name), torch.tensor(labels), is_inverted=is_inverted
    )
    assert type(got) is float
    assert got == pytest.approx(oracle_equal_error_rate(scores, labels, is_inverted), abs=1e-12)


def test_equal_error_rate_against_scikit_learn_roc() -> None:
    """Where the interpolated ROC curve crosses tpr = 1 - fpr, found by bisection."""
    generator = np.random.default_rng(9)
    scores = generator.standard_normal(500)
    labels = generator.random(500) < 1 / (1 + np.exp(-1.5 * scores))
    fpr, tpr, _ = roc_curve(labels, scores)
    low, high = 0.0, 1.0
    for _ in range(200):
        middle = (low + high) / 2
        if 1 - middle - np.interp(middle, fpr, tpr) > 0:
            low = middle
        else:
            high = middle
    expected = (low + high) / 2
    assert equal_error_rate(scores, labels, is_inverted=True) == pytest.approx(expected, abs=1e-9)
    assert equal_error_rate(-scores, labels, is_inverted=False) == pytest.approx(expected, abs=1e-9)


def test_equal_error_rate_extremes() -> None:
    scores = torch.tensor([0.9, 0.8, 0.2, 0.1])
    assert equal_error_rate(scores, torch.tensor([True, True, False, False]), is_inverted=True) == 0
    assert equal_error_rate(scores, torch.tensor([False, False, True, True]), is_inverted=True) == 1


# ---- k-fold -------------------------------------------------------------------------------


@pytest.mark.parametrize("folds", [2, 3, 10])
@pytest.mark.parametrize("is_inverted", [True, False])
def test_kfold_against_a_plain_loop(folds, is_inverted) -> None:
    generator = torch.Generator().manual_seed(folds)
    scores = torch.round(torch.randn(203, generator=generator) * 4) / 4
    labels = torch.rand(203, generator=generator) < torch.sigmoid(2 * scores)
    if not is_inverted:
        scores = -scores
    result = kfold_threshold_evaluation(
        scores, labels, match_accuracy, is_inverted=is_inverted, folds=folds, seed=7
    )
    assert isinstance(result, KFoldEvaluation) and len(result.folds) == folds
    held_out = [fold.test_indices.tolist() for fold in result.folds]
    assert sorted(i for indices in held_out for i in indices) == list(range(203))
    positives = int(labels.sum())
    for fold in result.folds:
        assert isinstance(fold, FoldEvaluation)
        held = set(fold.test_indices.tolist())
        # stratified: each class is dealt evenly
        assert len(fold.test_indices) in (203 // folds, 203 // folds + 1)
        fold_positives = int(labels[fold.test_indices].sum())
        assert fold_positives in (positives // folds, positives // folds + 1)
        train = [i for i in range(203) if i not in held]
        train_scores, train_labels = scores[train].tolist(), labels[train].tolist()
        threshold, value = oracle_selection(
            train_scores, train_labels, py_accuracy, "float32", is_inverted
        )
        assert (fold.threshold, fold.train_value) == (threshold, value)
        test_scores = scores[fold.test_indices].tolist()
        test_labels = labels[fold.test_indices].tolist()
        counts = count(test_scores, test_labels, decide(test_scores, threshold, is_inverted))
        assert tuple(field.item() for field in fold.test_counts) == counts
        assert fold.test_value == py_accuracy(*counts)
    values = [fold.test_value for fold in result.folds]
    assert result.mean == pytest.approx(sum(values) / folds, abs=1e-15)
    mean = sum(values) / folds
    assert result.std == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / folds))


def test_kfold_is_deterministic_per_seed() -> None:
    generator = np.random.default_rng(0)
    scores = generator.standard_normal(100).astype(np.float32)
    labels = generator.random(100) < 0.5
    first = kfold_threshold_evaluation(scores, labels, match_f1, is_inverted=True, seed=3)
    again = kfold_threshold_evaluation(scores, labels, match_f1, is_inverted=True, seed=3)
    other = kfold_threshold_evaluation(scores, labels, match_f1, is_inverted=True, seed=4)
    assert [f.test_indices.tolist() for f in first.folds] == [
        f.test_indices.tolist() for f in again.folds
    ]
    assert (first.mean, first.std) == (again.mean, again.std)
    assert [f.test_indices.tolist() for f in first.folds] != [
        f.test_indices.tolist() for f in other.folds
    ]


def test_kfold_constrained_metric_is_nan_where_a_held_out_fold_breaks_it() -> None:
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    labels = torch.tensor([True, False, True, False, True, False, True, False])
    result = kfold_threshold_evaluation(
        scores, labels, recall_at_false_match_rate(0.0), is_inverted=True, folds=2
    )
    for fold in result.folds:
        tp, fp, tn, fn = (field.item() for field in fold.test_counts)
        if fp > 0:
            assert math.isnan(fold.test_value)
        else:
            assert fold.test_value == tp / (tp + fn)
    assert math.isnan(result.mean) == any(math.isnan(f.test_value) for f in result.folds)


KFOLD_ERRORS = {
    "one fold": (dict(folds=1), ValueError),
    "more folds than pairs": (dict(folds=9), ValueError),
    "string folds": (dict(folds="10"), TypeError),
    "negative seed": (dict(seed=-1), ValueError),
    "float seed": (dict(seed=0.5), TypeError),
}


@pytest.mark.parametrize("case", sorted(KFOLD_ERRORS))
def test_kfold_invalid_arguments(case) -> None:
    options, error = KFOLD_ERRORS[case]
    scores = torch.arange(8.0)
    labels = scores < 4
    options = {"folds": 2, **options}
    with pytest.raises(error):
        kfold_threshold_evaluation(scores, labels, match_accuracy, is_inverted=False, **options)


def test_kfold_needs_two_pairs_of_each_class() -> None:
    scores = torch.arange(8.0)
    with pytest.raises(ValueError, match="at least 2"):
        kfold_threshold_evaluation(scores, scores < 1, match_accuracy, is_inverted=False, folds=2)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, y: threshold_curve(s, y, is_inverted=True),
        lambda s, y: equal_error_rate(s, y, is_inverted=True),
        lambda s, y: kfold_threshold_evaluation(s, y, match_accuracy, is_inverted=True, folds=2),
    ],
)
def test_invalid_pairs_raise_value_error(call) -> None:
    good_scores = torch.tensor([0.1, 0.2, 0.3, 0.4])
    good_labels = torch.tensor([True, False, True, False])
    for scores, labels in [
        (good_scores.int(), good_labels),
        (good_scores, good_labels.int()),
        (good_scores, good_labels[:3]),
        (torch.tensor([0.1, math.nan, 0.3, 0.4]), good_labels),
        (good_scores, torch.ones(4, dtype=torch.bool)),
    ]:
        with pytest.raises(ValueError):
            call(scores, labels)
    with pytest.raises(ValueError, match="is_inverted"):
        threshold_curve(good_scores, good_labels, is_inverted="yes")


def test_docstring_examples() -> None:
    assert doctest.testmod(verification, raise_on_error=True).attempted > 0
