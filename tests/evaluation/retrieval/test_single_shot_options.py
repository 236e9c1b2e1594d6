"""The single-gallery-shot options at their edges: refusals name every argument involved,
any number of draws runs in bounded memory, and no binomial interval is made of its
per-query expectations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _camera_sets import camera_sets
from hypothesis import given, settings
from hypothesis import strategies as st
from test_single_gallery_shot import MAX_RANK, drawn_cmc_loop, evaluate, kept_lists

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import bootstrap_intervals
from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator, _single_shot

pytestmark = pytest.mark.filterwarnings("ignore:No query group occurs")


def _case():
    generator = torch.Generator().manual_seed(5)
    query, gallery = torch.randn(6, 3, generator=generator), torch.randn(20, 3, generator=generator)
    ids = (torch.tensor([1, 2, 3, 1, 2, 3]), torch.randint(1, 4, (20,), generator=generator))
    cams = (torch.zeros(6, dtype=torch.long), torch.randint(0, 2, (20,), generator=generator))
    return query, gallery, ids, cams


EQUALITY_FN = staticmethod(lambda a, b: a == b)
# Every refusal that involves single_gallery_shot, its draws or the groups: (calculator
# options, get_accuracy options, the argument names the message must carry).
REFUSALS = [
    ({"label_comparison_fn": EQUALITY_FN}, {"single_gallery_shot": True},
     ["single_gallery_shot", "label_comparison_fn"]),
    ({"label_comparison_fn": EQUALITY_FN},
     {"single_gallery_shot": True, "single_gallery_shot_draws": 3},
     ["single_gallery_shot", "single_gallery_shot_draws", "label_comparison_fn"]),
    ({"label_comparison_fn": EQUALITY_FN}, {"groups": True},
     ["query_groups", "reference_groups", "label_comparison_fn"]),
    ({}, {"single_gallery_shot_draws": 3}, ["single_gallery_shot_draws", "single_gallery_shot"]),
    ({}, {"single_gallery_shot": False, "single_gallery_shot_draws": 3},
     ["single_gallery_shot_draws", "single_gallery_shot"]),
    ({}, {"query_only": True}, ["reference_groups", "query_groups"]),
    ({}, {"reference_only": True}, ["query_groups", "reference_groups"]),
]  # fmt: skip


@pytest.mark.parametrize(("calculator_options", "options", "names"), REFUSALS)
def test_every_refusal_names_each_argument_involved(calculator_options, options, names) -> None:
    query, gallery, ids, cams = _case()
    options = dict(options)
    if options.pop("groups", False):
        options.update(query_groups=cams[0], reference_groups=cams[1])
    if options.pop("query_only", False):
        options["query_groups"] = cams[0]
    if options.pop("reference_only", False):
        options["reference_groups"] = cams[1]
    calculator = AccuracyCalculator(include=("recall_at_1",), **calculator_options)
    with pytest.raises(InvalidArgumentError) as caught:
        calculator.get_accuracy(query, ids[0], gallery, ids[1], **options)
    for name in names:
        assert f"'{name}'" in str(caught.value) or f"{name}=" in str(caught.value), name


@pytest.mark.parametrize(
    ("draws", "error"),
    [(0, ValueError), (-3, ValueError), (2.0, TypeError), (2.5, TypeError), (True, TypeError),
     (False, TypeError), ("10", TypeError), (np.float64(3), TypeError)],
)  # fmt: skip
def test_bad_draws_are_refused_by_name(draws, error) -> None:
    with pytest.raises(error, match="'single_gallery_shot_draws'"):
        evaluate(_case(), single_gallery_shot=True, single_gallery_shot_draws=draws)


@settings(max_examples=25, deadline=None)
@given(
    data=camera_sets(num_query=(1, 6), num_gallery=(4, 30), identities=(1, 6)),
    draws=st.integers(1, 40),
    chunk=st.integers(1, 9),
)
def test_draws_in_chunks_are_the_draws_at_once_in_bounded_memory(
    data, draws, chunk, monkeypatch_module
) -> None:
    """Any chunk size gives the plain loop's numbers (the same random stream), and no
    draw asks for more random integers at once than a chunk (or one draw) holds."""
    lists = kept_lists(data[0], data[1], data[2], data[3])
    np.random.seed(11)
    curves = [drawn_cmc_loop(*kept, MAX_RANK, draws) for kept in lists if kept is not None]
    sizes: list[int] = []
    randint = np.random.randint

    def spy(low, high, *args, **kwargs):
        sizes.append(int(np.size(high)))
        return randint(low, high, *args, **kwargs)

    monkeypatch_module.setattr(_single_shot, "_DRAW_ELEMENTS", chunk)
    monkeypatch_module.setattr(np.random, "randint", spy)
    try:
        np.random.seed(11)
        result, _ = evaluate(data, single_gallery_shot=True, single_gallery_shot_draws=draws)
    finally:
        monkeypatch_module.undo()
    identities = max((len(set(kept[0])) for kept in lists if kept is not None), default=0)
    assert all(size <= max(chunk, identities) for size in sizes)
    if curves:
        expected = np.mean(curves, axis=0)
        for rank in range(1, MAX_RANK + 1):
            assert result[f"recall_at_{rank}"] == pytest.approx(expected[rank - 1], abs=1e-9)


@pytest.fixture(scope="module")
def monkeypatch_module():
    patcher = pytest.MonkeyPatch()
    yield patcher
    patcher.undo()


def test_a_million_draws_run_in_chunks() -> None:
    """Draws far past one chunk run (a count that would once have been one huge array)."""
    query, gallery, ids, cams = _case()
    calculator = AccuracyCalculator(include=("recall_at_1",))
    expected = calculator.get_accuracy(
        query[:1], ids[0][:1], gallery, ids[1], query_groups=cams[0][:1],
        reference_groups=cams[1], single_gallery_shot=True,
    )["recall_at_1"]  # fmt: skip
    np.random.seed(0)
    drawn = calculator.get_accuracy(
        query[:1], ids[0][:1], gallery, ids[1], query_groups=cams[0][:1],
        reference_groups=cams[1], single_gallery_shot=True, single_gallery_shot_draws=10**6,
    )["recall_at_1"]  # fmt: skip
    assert drawn == pytest.approx(expected, abs=0.005)  # 5 standard errors at most


def _per_query(single_shot: bool):
    query, gallery, ids, cams = _case()
    calculator = AccuracyCalculator(include=("recall_at_1", "recall_at_20", "precision_at_1"))
    return calculator.get_accuracy(
        query, ids[0], gallery, ids[1], query_groups=cams[0], reference_groups=cams[1],
        single_gallery_shot=single_shot, return_per_query=True,
    )["per_query"]  # fmt: skip


def test_auto_bootstraps_single_shot_expectations_even_when_they_are_0_or_1() -> None:
    per_query = _per_query(True)
    # recall_at_20 reaches every identity: 1 for every query, yet an expectation
    assert bool((per_query.values["recall_at_20"] == 1).all())
    intervals = bootstrap_intervals(per_query, num_resamples=50)
    assert {found.method for found in intervals.values()} == {"percentile"}
    plain = bootstrap_intervals(_per_query(False), num_resamples=50)
    assert plain["recall_at_1"].method == "clopper_pearson"


def test_clopper_pearson_is_refused_for_single_shot_expectations() -> None:
    with pytest.raises(InvalidArgumentError, match="'method'.*single_gallery_shot"):
        bootstrap_intervals(_per_query(True), num_resamples=50, method="clopper_pearson")


@pytest.mark.parametrize(("draws", "how"), [(None, "exact expectation"), (5, "5 random draws")])
def test_the_log_says_what_single_shot_searches(caplog, draws, how) -> None:
    query, gallery, ids, cams = _case()
    calculator = AccuracyCalculator(include=("precision_at_1",), k=None)
    with caplog.at_level("INFO", logger=AccuracyCalculator.__module__):
        calculator.get_accuracy(
            query, ids[0], gallery, ids[1], query_groups=cams[0], reference_groups=cams[1],
            single_gallery_shot=True, single_gallery_shot_draws=draws,
        )  # fmt: skip
    searched = [
        record.getMessage() for record in caplog.records if "per query" in record.getMessage()
    ]
    assert len(searched) == 1, searched
    assert f"every candidate among the {len(gallery)} references" in searched[0]
    assert how in searched[0] and "k=1 neighbours" not in searched[0]
