"""select_threshold, MatchCounts and the built-in metrics, against a brute-force oracle."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from _threshold_oracle import (
    NUMPY_DTYPES,
    as_tensor,
    candidate_counts,
    count,
    decide,
    oracle_selection,
    py_accuracy,
    py_balanced_accuracy,
    py_f1,
    validation_pairs,
)
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score, f1_score

from pytorch_metric_learning.distances import DotProductSimilarity, LpDistance
from pytorch_metric_learning.evaluation import (
    MatchCounts,
    MatchFinder,
    ThresholdSelection,
    match_accuracy,
    match_balanced_accuracy,
    match_f1,
    select_threshold,
)
from pytorch_metric_learning.evaluation.verification import thresholds

METRICS = [
    (match_accuracy, py_accuracy),
    (match_balanced_accuracy, py_balanced_accuracy),
    (match_f1, py_f1),
]


# ---- the seed's code samples, verbatim ------------------------------------------------


def test_one_shot_and_custom_metric_samples() -> None:
    """The verification, one-shot and custom-metric samples, verbatim, in the spec's order."""
    import torch

    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.evaluation import MatchFinder, match_f1, select_threshold

    distance = CosineSimilarity()
    first = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    second = torch.tensor([[1.0, 0.1], [1.0, 0.3], [0.2, 1.0], [-1.0, 0.0]])
    is_same = torch.tensor([True, True, False, False])

    selection = select_threshold(
        distance.pairwise(first, second),
        is_same,
        match_f1,
        is_inverted=distance.is_inverted,
    )
    finder = MatchFinder(distance, threshold=selection.threshold)
    assert selection.value == 1.0
    assert finder.is_match(first, second).tolist() == is_same.tolist()

    from pytorch_metric_learning.evaluation import CustomKNN

    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    gallery_labels = torch.tensor([0, 1])
    query = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0], [-1.0, -0.5]])
    query_labels = torch.tensor([0, 1, 2, 3])

    similarities, neighbors = CustomKNN(distance)(query, 1, gallery)
    correct = gallery_labels[neighbors[:, 0]] == query_labels
    selection = select_threshold(
        similarities[:, 0], correct, match_f1, is_inverted=distance.is_inverted
    )
    accepted = similarities[:, 0] >= selection.threshold
    assert accepted.tolist() == [True, True, False, False]

    def recall_at_low_false_match_rate(counts):
        recall = counts.true_positives / (counts.true_positives + counts.false_negatives)
        false_match_rate = counts.false_positives / (counts.false_positives + counts.true_negatives)
        return torch.where(false_match_rate <= 0.01, recall, torch.nan)

    selection = select_threshold(
        similarities[:, 0],
        correct,
        recall_at_low_false_match_rate,
        is_inverted=True,
    )
    assert selection.value == 1.0


# ---- the oracle -----------------------------------------------------------------------


@given(
    validation_pairs(),
    st.sampled_from(METRICS),
    st.booleans(),
    st.sampled_from(["torch", "numpy"]),
)
def test_matches_brute_force_oracle(pairs, metric_pair, is_inverted, library) -> None:
    scores, labels, dtype_name = pairs
    metric, py_metric = metric_pair
    expected = oracle_selection(scores, labels, py_metric, dtype_name, is_inverted)
    if library == "numpy" and dtype_name in NUMPY_DTYPES:
        score_input = np.array(scores, dtype=NUMPY_DTYPES[dtype_name])
        label_input = np.array(labels)
    else:
        score_input, label_input = as_tensor(scores, dtype_name), torch.tensor(labels)
    if expected is None:
        with pytest.raises(ValueError, match="NaN for every candidate"):
            select_threshold(score_input, label_input, metric, is_inverted=is_inverted)
        return
    selection = select_threshold(score_input, label_input, metric, is_inverted=is_inverted)
    assert selection == expected
    assert type(selection.threshold) is float and type(selection.value) is float


@given(validation_pairs(), st.booleans())
def test_counts_are_float64_cpu_strictest_first(pairs, is_inverted) -> None:
    scores, labels, dtype_name = pairs
    seen: list[MatchCounts] = []

    def recording_metric(counts: MatchCounts) -> torch.Tensor:
        seen.append(counts)
        return match_accuracy(counts)

    select_threshold(
        as_tensor(scores, dtype_name),
        torch.tensor(labels),
        recording_metric,
        is_inverted=is_inverted,
    )
    (counts,) = seen
    assert isinstance(counts, MatchCounts)
    for field in counts:
        assert field.dtype == torch.float64 and field.device.type == "cpu" and field.ndim == 1
        assert not field.requires_grad
    expected = candidate_counts(scores, labels, is_inverted)
    got = list(zip(*(field.tolist() for field in counts)))
    assert got == [tuple(float(c) for c in row) for row in expected]


@given(validation_pairs(), st.sampled_from(METRICS), st.booleans())
def test_threshold_reproduces_counted_decisions(pairs, metric_pair, is_inverted) -> None:
    """Applied with >= / <= to the original-dtype scores, the threshold gives `value`."""
    scores, labels, dtype_name = pairs
    metric, py_metric = metric_pair
    tensor = as_tensor(scores, dtype_name)
    try:
        selection = select_threshold(tensor, torch.tensor(labels), metric, is_inverted=is_inverted)
    except ValueError:  # the metric is NaN everywhere (checked by the oracle test)
        return
    matched = tensor >= selection.threshold if is_inverted else tensor <= selection.threshold
    assert py_metric(*count(scores, labels, matched.tolist())) == selection.value
    if dtype_name in NUMPY_DTYPES:
        array = np.array(scores, dtype=NUMPY_DTYPES[dtype_name])
        matched = array >= selection.threshold if is_inverted else array <= selection.threshold
        assert py_metric(*count(scores, labels, matched.tolist())) == selection.value


@given(validation_pairs(max_size=10), st.booleans())
def test_threshold_reproduces_decisions_through_match_finder(pairs, is_inverted) -> None:
    """One-dimensional embeddings whose pairwise value is exactly the score."""
    scores, labels, dtype_name = pairs
    if not is_inverted:
        scores = [abs(s) for s in scores]
    tensor = as_tensor(scores, dtype_name)
    selection = select_threshold(
        tensor, torch.tensor(labels), match_accuracy, is_inverted=is_inverted
    )
    if is_inverted:
        distance = DotProductSimilarity(normalize_embeddings=False)
        other = torch.ones_like(tensor)
    else:
        distance = LpDistance(normalize_embeddings=False, p=1)
        other = torch.zeros_like(tensor)
    values = distance.pairwise(tensor[:, None], other[:, None])
    assert values.double().tolist() == tensor.double().tolist()
    matched = MatchFinder(distance, selection.threshold).is_match(tensor[:, None], other[:, None])
    assert matched.tolist() == decide(scores, selection.threshold, is_inverted)
    assert py_accuracy(*count(scores, labels, matched.tolist())) == selection.value


def test_larger_input_with_ties_matches_oracle() -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.round(torch.randn(400, generator=generator) * 8) / 8
    labels = torch.rand(400, generator=generator) < torch.sigmoid(scores)
    for is_inverted in (True, False):
        for metric, py_metric in METRICS:
            expected = oracle_selection(
                scores.tolist(), labels.tolist(), py_metric, "float32", is_inverted
            )
            assert select_threshold(scores, labels, metric, is_inverted=is_inverted) == expected


# ---- each rule of the spec, on a hand-made case ----------------------------------------


def test_midpoint_between_neighbours() -> None:
    scores = torch.tensor([0.25, 0.75], dtype=torch.float64)
    labels = torch.tensor([True, False])
    assert select_threshold(scores, labels, match_accuracy, is_inverted=False) == (0.5, 1.0)
    assert select_threshold(scores, ~labels, match_accuracy, is_inverted=True) == (0.5, 1.0)


@pytest.mark.parametrize("np_dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("is_inverted", [True, False])
def test_adjacent_floats_use_the_weaker_matching_score(np_dtype, is_inverted) -> None:
    low = np_dtype(1.0)
    high = np.nextafter(low, np_dtype(2.0))
    scores = np.array([low, high], dtype=np_dtype)
    labels = np.array([not is_inverted, is_inverted])
    selection = select_threshold(scores, labels, match_accuracy, is_inverted=is_inverted)
    matching = high if is_inverted else low
    assert selection == (float(matching), 1.0)
    matched = scores >= selection.threshold if is_inverted else scores <= selection.threshold
    assert matched.tolist() == labels.tolist()
    tensor = torch.from_numpy(scores)
    matched = tensor >= selection.threshold if is_inverted else tensor <= selection.threshold
    assert matched.tolist() == labels.tolist()


def test_float32_midpoint_that_rounds_onto_a_neighbour_is_not_used() -> None:
    """In float64 the midpoint of two float32 neighbours is between them; in float32 not."""
    low = np.float32(0.1)
    high = np.nextafter(low, np.float32(1.0))
    mid = (float(low) + float(high)) / 2
    assert float(low) < mid < float(high)
    assert np.float32(mid) in (low, high)
    scores = torch.tensor([float(low), float(high)], dtype=torch.float32)
    selection = select_threshold(
        scores, torch.tensor([True, False]), match_accuracy, is_inverted=False
    )
    assert selection.threshold == float(low)
    assert (scores <= selection.threshold).tolist() == [True, False]


@pytest.mark.parametrize("is_inverted", [True, False])
def test_every_pair_matches_at_the_weakest_score(is_inverted) -> None:
    scores = torch.tensor([0.2, 0.5, 0.9])
    # the weakest score (0.2 for similarities, 0.9 for distances) belongs to a positive
    labels = torch.tensor([True, True, False] if is_inverted else [False, True, True])

    def no_missed_positive(counts: MatchCounts) -> torch.Tensor:
        return counts.false_negatives.eq(0).double()

    selection = select_threshold(scores, labels, no_missed_positive, is_inverted=is_inverted)
    weakest = scores.min() if is_inverted else scores.max()
    assert selection == (float(weakest), 1.0)
    # a new pair beyond it does not match
    beyond = torch.nextafter(weakest, torch.tensor(-math.inf if is_inverted else math.inf))
    finder = MatchFinder(DotProductSimilarity() if is_inverted else LpDistance())
    matched = finder._decide(torch.stack([weakest, beyond]), selection.threshold)
    assert matched.tolist() == [True, False]


@pytest.mark.parametrize("is_inverted, expected", [(True, math.inf), (False, -math.inf)])
def test_no_pair_matches_at_infinity(is_inverted, expected) -> None:
    scores = torch.tensor([0.1, 0.4, 0.8])
    labels = torch.tensor([True, False, True])

    def specificity(counts: MatchCounts) -> torch.Tensor:
        return counts.true_negatives / (counts.true_negatives + counts.false_positives)

    assert select_threshold(scores, labels, specificity, is_inverted=is_inverted) == (
        expected,
        1.0,
    )


@pytest.mark.parametrize("is_inverted", [True, False])
def test_ties_go_to_the_fewest_matches(is_inverted) -> None:
    scores = torch.tensor([0.1, 0.4, 0.8])
    labels = torch.tensor([True, False, True])
    constant = select_threshold(
        scores, labels, lambda c: torch.ones_like(c.true_positives), is_inverted=is_inverted
    )
    assert constant.threshold == (math.inf if is_inverted else -math.inf)
    # accuracy is 2/3 matching the strongest only and matching everything: the first wins
    accuracy = select_threshold(scores, labels, match_accuracy, is_inverted=is_inverted)
    strongest, second = (0.8, 0.4) if is_inverted else (0.1, 0.4)
    expected = (float(torch.tensor(strongest)) + float(torch.tensor(second))) / 2
    assert accuracy == (expected, 2 / 3)


def test_nan_candidates_are_skipped() -> None:
    scores = torch.tensor([0.1, 0.4, 0.8])
    labels = torch.tensor([True, False, True])

    def only_last(counts: MatchCounts) -> torch.Tensor:
        values = torch.full_like(counts.true_positives, torch.nan)
        values[-1] = 0.25
        return values

    assert select_threshold(scores, labels, only_last, is_inverted=True).value == 0.25


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_signed_zeros_are_one_score(dtype) -> None:
    scores = torch.tensor([-0.0, 0.0, 1.0, -0.0], dtype=dtype)
    labels = torch.tensor([True, False, False, True])
    seen: list[MatchCounts] = []

    def metric(counts: MatchCounts) -> torch.Tensor:
        seen.append(counts)
        return match_accuracy(counts)

    selection = select_threshold(scores, labels, metric, is_inverted=False)
    assert seen[0].true_positives.tolist() == [0.0, 2.0, 2.0]
    assert selection == (0.5, 0.75)


def test_torch_and_numpy_inputs_agree() -> None:
    generator = np.random.default_rng(1)
    scores = generator.standard_normal(200).astype(np.float32)
    labels = generator.random(200) < 0.4
    for is_inverted in (True, False):
        from_numpy = select_threshold(scores, labels, match_f1, is_inverted=is_inverted)
        from_torch = select_threshold(
            torch.from_numpy(scores), torch.from_numpy(labels), match_f1, is_inverted=is_inverted
        )
        assert from_numpy == from_torch


def test_read_only_and_non_native_arrays() -> None:
    scores = np.array([0.1, 0.7, 0.3], dtype=">f8")
    labels = np.array([False, True, False])
    scores.flags.writeable = False
    assert select_threshold(scores, labels, match_accuracy, is_inverted=True) == (0.5, 1.0)


def test_keeps_no_autograd_graph_and_returns_python_floats() -> None:
    scores = torch.tensor([0.9, 0.2, 0.6], requires_grad=True)
    labels = torch.tensor([True, False, True])
    seen: list[MatchCounts] = []

    def metric(counts: MatchCounts) -> torch.Tensor:
        seen.append(counts)
        return match_accuracy(counts)

    selection = select_threshold(scores * 2, labels, metric, is_inverted=True)
    assert isinstance(selection, ThresholdSelection)
    assert type(selection.threshold) is float and type(selection.value) is float
    assert not any(field.requires_grad for field in seen[0])


def test_metric_may_return_other_array_types() -> None:
    scores = torch.tensor([0.9, 0.2, 0.6])
    labels = torch.tensor([True, False, True])
    selection = select_threshold(
        scores, labels, lambda c: match_accuracy(c).numpy(), is_inverted=True
    )
    assert selection == select_threshold(scores, labels, match_accuracy, is_inverted=True)


# ---- invalid inputs -------------------------------------------------------------------

GOOD_SCORES = torch.tensor([0.1, 0.5, 0.9])
GOOD_LABELS = torch.tensor([True, False, True])

INVALID_PAIRS = {
    "2-D scores": (GOOD_SCORES[None], GOOD_LABELS),
    "0-D scores": (torch.tensor(0.5), torch.tensor(True)),
    "integer scores": (torch.tensor([1, 2, 3]), GOOD_LABELS),
    "complex scores": (GOOD_SCORES.to(torch.complex64), GOOD_LABELS),
    "list scores": ([0.1, 0.5, 0.9], GOOD_LABELS),
    "integer numpy scores": (np.array([1, 2, 3]), GOOD_LABELS),
    "NaN score": (torch.tensor([0.1, math.nan, 0.9]), GOOD_LABELS),
    "infinite score": (torch.tensor([0.1, math.inf, 0.9]), GOOD_LABELS),
    "integer labels": (GOOD_SCORES, torch.tensor([1, 0, 1])),
    "float labels": (GOOD_SCORES, np.array([1.0, 0.0, 1.0])),
    "list labels": (GOOD_SCORES, [True, False, True]),
    "shorter labels": (GOOD_SCORES, GOOD_LABELS[:2]),
    "2-D labels": (GOOD_SCORES, GOOD_LABELS[None]),
    "only True": (GOOD_SCORES, torch.ones(3, dtype=torch.bool)),
    "only False": (GOOD_SCORES, torch.zeros(3, dtype=torch.bool)),
    "empty": (torch.zeros(0), torch.zeros(0, dtype=torch.bool)),
}
if np.dtype(np.longdouble).itemsize > 8:
    INVALID_PAIRS["long double scores"] = (np.array([0.1, 0.5, 0.9], np.longdouble), GOOD_LABELS)


@pytest.mark.parametrize("case", sorted(INVALID_PAIRS))
def test_invalid_pairs_raise_value_error(case) -> None:
    scores, labels = INVALID_PAIRS[case]
    with pytest.raises(ValueError):
        select_threshold(scores, labels, match_accuracy, is_inverted=True)


INVALID_METRICS = {
    "scalar": lambda counts: match_accuracy(counts).max(),
    "too long": lambda counts: torch.cat([match_accuracy(counts), torch.zeros(1)]),
    "2-D": lambda counts: match_accuracy(counts)[:, None],
    "all NaN": lambda counts: torch.full_like(counts.true_positives, torch.nan),
    "not an array": lambda counts: "accuracy",
    "complex": lambda counts: match_accuracy(counts).to(torch.complex128),
}


@pytest.mark.parametrize("case", sorted(INVALID_METRICS))
def test_invalid_metric_output_raises_value_error(case) -> None:
    with pytest.raises(ValueError, match="metric"):
        select_threshold(GOOD_SCORES, GOOD_LABELS, INVALID_METRICS[case], is_inverted=True)


@pytest.mark.parametrize("is_inverted", [None, 1, "yes"])
def test_is_inverted_must_be_a_bool(is_inverted) -> None:
    with pytest.raises(ValueError, match="is_inverted"):
        select_threshold(GOOD_SCORES, GOOD_LABELS, match_accuracy, is_inverted=is_inverted)


def test_metric_must_be_callable() -> None:
    with pytest.raises(ValueError, match="metric"):
        select_threshold(GOOD_SCORES, GOOD_LABELS, "f1", is_inverted=True)


def test_is_inverted_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        select_threshold(GOOD_SCORES, GOOD_LABELS, match_accuracy, True)  # type: ignore[misc]


# ---- the built-in metrics -------------------------------------------------------------


@given(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30),
)
def test_metrics_match_scikit_learn(pairs) -> None:
    truth = [label for label, _ in pairs]
    predicted = [decision for _, decision in pairs]
    tp, fp, tn, fn = count([0.0] * len(pairs), truth, predicted)
    counts = MatchCounts(*(torch.tensor([float(v)], dtype=torch.float64) for v in (tp, fp, tn, fn)))
    assert match_accuracy(counts).item() == pytest.approx(
        sum(t == p for t, p in pairs) / len(pairs)
    )
    f1 = f1_score(truth, predicted, zero_division=np.nan)
    assert match_f1(counts).item() == pytest.approx(f1, nan_ok=True)
    if any(truth) and not all(truth):
        balanced = balanced_accuracy_score(truth, predicted)
        assert match_balanced_accuracy(counts).item() == pytest.approx(balanced)
    else:
        assert math.isnan(match_balanced_accuracy(counts).item())


def test_accuracy_favours_the_majority_where_balanced_accuracy_does_not() -> None:
    # most alike first: N N P N N P N N P N N N
    labels = torch.tensor([False, False, True] * 3 + [False] * 3)
    scores = torch.linspace(1.0, 0.0, 12, dtype=torch.float64)
    accuracy = select_threshold(scores, labels, match_accuracy, is_inverted=True)
    assert accuracy == (math.inf, 9 / 12)
    balanced = select_threshold(scores, labels, match_balanced_accuracy, is_inverted=True)
    assert balanced == ((scores[8].item() + scores[9].item()) / 2, (1 + 3 / 9) / 2)


def test_docstring_examples() -> None:
    assert doctest.testmod(thresholds, raise_on_error=True).attempted > 0
