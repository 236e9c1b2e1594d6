"""The torch-free metric names that the command line checks agree with the calculator's."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning._metric_catalog import parametrized_parts
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.retrieval._metric_names import parse_metric_name

NAMES = st.one_of(
    st.builds(
        lambda family, k: f"{family}_at_{k}",
        st.sampled_from(["recall", "precision", "mean_average_precision", "ndcg", "map", ""]),
        st.one_of(st.integers(-3, 5000).map(str), st.sampled_from(["r", "", "01", "1.0", " 1"])),
    ),
    st.text(alphabet="abcdeilnoprt_0123456789", max_size=30),
)


@given(NAMES)
def test_parametrized_names_match_a_plain_pattern_and_the_calculator(name: str) -> None:
    expected = re.fullmatch(r"(recall|precision|mean_average_precision|ndcg)_at_([1-9]\d*)", name)
    parts = parametrized_parts(name)
    assert (parts is not None) == (expected is not None)
    if expected is not None:
        assert parts == (expected.group(1), int(expected.group(2)))
        metric = parse_metric_name(name)
        assert metric is not None and (metric.family, metric.k) == parts


def test_default_and_on_request_names_are_the_calculators() -> None:
    from pytorch_metric_learning._metric_catalog import DEFAULT_METRICS, ON_REQUEST_METRICS

    assert sorted(AccuracyCalculator().get_curr_metrics()) == sorted(DEFAULT_METRICS)
    every = AccuracyCalculator(include=DEFAULT_METRICS + ON_REQUEST_METRICS)
    assert sorted(every.get_curr_metrics()) == sorted(DEFAULT_METRICS + ON_REQUEST_METRICS)
