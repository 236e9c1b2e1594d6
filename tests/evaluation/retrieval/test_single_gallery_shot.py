"""The single-gallery-shot mode of the re-identification protocol (torchreid's CUHK03 mode).

The oracles are written here from the protocol's text, one query at a time: sort the
gallery by (distance, index), drop the same-identity same-camera images, the junk and the
excluded pairs ("kept"); a query with no relevant kept image is left out. The exact
expectation enumerates every combination of one kept image per identity, with its
probability; the random draws loop over the queries, the draws and the identities (in the
order of their first kept image), calling ``np.random.choice`` on each identity's positions.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from _camera_sets import camera_sets, evaluate_camera_set
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator, cmc_curve

# hypothesis may give the queries cameras that no gallery image has (a warning says so)
pytestmark = pytest.mark.filterwarnings("ignore:No query group occurs")
MAX_RANK = 5
CMC_METRICS = tuple(f"recall_at_{rank}" for rank in range(1, MAX_RANK + 1)) + ("precision_at_1",)
RANKING_METRICS = (
    "mean_average_precision",
    "mean_inverse_negative_penalty",
    "r_precision",
    "mean_average_precision_at_r",
)


def kept_lists(query, gallery, ids, cams, junk=(-1,), distractors=(0,)):
    """Per query: the kept gallery identities in ranked order, and which are relevant;
    None for a query with no relevant kept image."""
    q, g = query.double().numpy(), gallery.double().numpy()
    distances = ((q[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    query_ids, gallery_ids = ids[0].tolist(), ids[1].tolist()
    query_cams, gallery_cams = cams[0].tolist(), cams[1].tolist()
    found = []
    for row in range(len(q)):
        order = sorted(range(len(g)), key=lambda j: (distances[row, j], j))
        kept = [
            j
            for j in order
            if not (gallery_ids[j] == query_ids[row] and gallery_cams[j] == query_cams[row])
            and gallery_ids[j] not in junk
        ]
        kept_ids = [gallery_ids[j] for j in kept]
        relevant = [i == query_ids[row] and i not in distractors for i in kept_ids]
        found.append((kept_ids, relevant) if any(relevant) else None)
    return found


def enumerated_cmc(kept_ids, relevant, max_rank):
    """The CMC averaged over every combination of one kept image per identity."""
    positions: dict[int, list[int]] = {}
    for position, identity in enumerate(kept_ids):
        positions.setdefault(identity, []).append(position)
    own = kept_ids[relevant.index(True)]
    cmc = np.zeros(max_rank)
    for combination in itertools.product(*positions.values()):
        chance = 1.0
        for group in positions.values():
            chance /= len(group)
        drawn = dict(zip(positions, combination))
        rank = 1 + sum(1 for position in combination if position < drawn[own])
        cmc += chance * (np.arange(1, max_rank + 1) >= rank)
    return cmc


def drawn_cmc_loop(kept_ids, relevant, max_rank, draws):
    """torchreid's procedure as the protocol describes it, with NumPy's global state."""
    positions: dict[int, list[int]] = {}
    for position, identity in enumerate(kept_ids):
        positions.setdefault(identity, []).append(position)
    cmc = np.zeros(max_rank)
    for _ in range(draws):
        mask = np.zeros(len(kept_ids), dtype=bool)
        for group in positions.values():
            mask[np.random.choice(group)] = True
        hits = np.cumsum(np.array(relevant)[mask]) > 0
        cmc += [hits[min(rank, len(hits) - 1)] for rank in range(max_rank)]
    return cmc / draws


def evaluate(data, metrics=CMC_METRICS, **options):
    return evaluate_camera_set(data, metrics, **options)


def assert_cmc(result, curves, tolerance):
    expected = np.mean(curves, axis=0)
    for rank in range(1, MAX_RANK + 1):
        assert result[f"recall_at_{rank}"] == pytest.approx(expected[rank - 1], abs=tolerance)
    assert result["precision_at_1"] == pytest.approx(expected[0], abs=tolerance)
    curve = cmc_curve(result["per_query"], MAX_RANK).numpy()
    np.testing.assert_allclose(curve, expected, atol=tolerance)
    per_query = result["per_query"].values["recall_at_3"].numpy()
    np.testing.assert_allclose(per_query, np.array(curves)[:, 2], atol=tolerance)


@settings(max_examples=60, deadline=None)
@given(data=camera_sets(num_query=(1, 8), num_gallery=(4, 12), identities=(1, 4)))
def test_expectation_equals_the_enumeration_of_every_draw(data) -> None:
    result, calculator = evaluate(data, single_gallery_shot=True)
    lists = kept_lists(data[0], data[1], data[2], data[3])
    curves = [enumerated_cmc(*kept, MAX_RANK) for kept in lists if kept is not None]
    assert calculator.last_num_queries_left_out == lists.count(None)
    if not curves:
        assert np.isnan(result["recall_at_1"])
        return
    assert_cmc(result, curves, 1e-9)


@settings(max_examples=40, deadline=None)
@given(
    data=camera_sets(num_query=(1, 8), num_gallery=(4, 40), identities=(1, 8)),
    draws=st.integers(1, 12),
)
def test_draws_equal_the_plain_loop_with_the_same_seed(data, draws) -> None:
    lists = kept_lists(data[0], data[1], data[2], data[3])
    np.random.seed(7)
    curves = [drawn_cmc_loop(*kept, MAX_RANK, draws) for kept in lists if kept is not None]
    np.random.seed(7)
    result, _ = evaluate(data, single_gallery_shot=True, single_gallery_shot_draws=draws)
    if curves:
        assert_cmc(result, curves, 1e-6)


def test_the_mean_of_many_draws_approaches_the_expectation() -> None:
    generator = torch.Generator().manual_seed(3)
    query, gallery = torch.randn(6, 4, generator=generator), torch.randn(60, 4, generator=generator)
    ids = (torch.arange(6) % 5 + 1, torch.randint(1, 9, (60,), generator=generator))
    cams = (torch.zeros(6, dtype=torch.long), torch.randint(0, 3, (60,), generator=generator))
    data = (query, gallery, ids, cams)
    exact, _ = evaluate(data, single_gallery_shot=True)
    np.random.seed(0)  # fixed: the check is deterministic
    drawn, _ = evaluate(data, single_gallery_shot=True, single_gallery_shot_draws=4000)
    for name in CMC_METRICS:
        assert 0 < exact[name] < 1
        assert drawn[name] == pytest.approx(exact[name], abs=0.02)


@settings(max_examples=30, deadline=None)
@given(data=camera_sets(num_query=(1, 8), num_gallery=(4, 30)), k=st.sampled_from([None, 1, 3]))
def test_ranking_metrics_stay_over_every_candidate(data, k) -> None:
    metrics = RANKING_METRICS + CMC_METRICS + ("precision_at_2", "ndcg_at_3")
    market, _ = evaluate(data, metrics, k=k)
    single, _ = evaluate(data, metrics, k=k, single_gallery_shot=True)
    for name in RANKING_METRICS + ("precision_at_2", "ndcg_at_3"):
        assert single[name] == market[name] or np.isnan(market[name])


@settings(max_examples=20, deadline=None)
@given(data=camera_sets(num_query=(1, 8), num_gallery=(4, 30)), budget=st.integers(1, 200))
def test_an_output_budget_leaves_single_shot_values_unchanged(data, budget) -> None:
    metrics = RANKING_METRICS + CMC_METRICS + ("precision_at_2",)
    whole, _ = evaluate(data, metrics, single_gallery_shot=True)
    budgeted, _ = evaluate(data, metrics, budget=budget, single_gallery_shot=True)
    for name in metrics:
        assert budgeted[name] == whole[name] or (np.isnan(whole[name]) and np.isnan(budgeted[name]))
    for name, values in whole["per_query"].values.items():
        torch.testing.assert_close(budgeted["per_query"].values[name], values, equal_nan=True)


@settings(max_examples=25, deadline=None)
@given(data=camera_sets(num_query=(1, 8), num_gallery=(1, 12), identities=(1, 1)))
def test_one_image_per_identity_equals_the_market_protocol(data) -> None:
    query, gallery, (query_ids, _), cams = data
    gallery_ids = torch.arange(1, len(gallery) + 1)  # every gallery image its own identity
    query_ids = (query_ids * 7) % (len(gallery) + 1) + 1
    data = (query, gallery, (query_ids, gallery_ids), cams)
    market, _ = evaluate(data)
    for options in ({}, {"single_gallery_shot_draws": 3}):
        single, _ = evaluate(data, single_gallery_shot=True, **options)
        for name in CMC_METRICS:
            assert single[name] == pytest.approx(market[name], abs=1e-12, nan_ok=True)


def test_worked_example_by_hand() -> None:
    """Query identity 1 (camera 0); gallery along a line: 1 (cam 1), 2, 2, 1 (cam 1), 3.
    Drawn image of identity 1 first (chance 1/2): rank 1. Else (the 4th image) identity 2
    always precedes it, identity 3 never: rank 2."""
    query = torch.tensor([[0.0]])
    gallery = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    result = AccuracyCalculator(include=("recall_at_1", "recall_at_2"), k=None).get_accuracy(
        query,
        torch.tensor([1]),
        gallery,
        torch.tensor([1, 2, 2, 1, 3]),
        query_groups=torch.tensor([0]),
        reference_groups=torch.tensor([1, 0, 0, 1, 0]),
        single_gallery_shot=True,
    )
    assert result == {"recall_at_1": 0.5, "recall_at_2": 1.0}


def test_without_groups_every_candidate_is_drawn_from() -> None:
    generator = torch.Generator().manual_seed(5)
    query, gallery = torch.randn(5, 3, generator=generator), torch.randn(12, 3, generator=generator)
    ids = (
        torch.randint(1, 4, (5,), generator=generator),
        torch.randint(1, 4, (12,), generator=generator),
    )
    calculator = AccuracyCalculator(include=CMC_METRICS, k=None)
    result = calculator.get_accuracy(
        query, ids[0], gallery, ids[1], single_gallery_shot=True, return_per_query=True
    )
    no_camera_rule = (torch.zeros(5, dtype=torch.long), torch.ones(12, dtype=torch.long))
    lists = kept_lists(query, gallery, ids, no_camera_rule)
    assert_cmc(result, [enumerated_cmc(*kept, MAX_RANK) for kept in lists if kept], 1e-9)


def test_one_set_in_two_roles_never_draws_the_query_itself() -> None:
    points = torch.tensor([[0.0], [0.1], [0.2], [3.0], [3.1]])
    labels = torch.tensor([1, 1, 2, 1, 2])
    result = AccuracyCalculator(include=("recall_at_1",), k=None).get_accuracy(
        points,
        labels,
        is_query=torch.tensor([True, False, False, False, False]),
        is_reference=torch.tensor([True, True, True, True, True]),
        single_gallery_shot=True,
    )
    # candidates of query 0: 1 (id 1), 2 (id 2), 3 (id 1), 4 (id 2); id 1 comes first when
    # image 1 is drawn (1/2), or image 3 and image 4 (1/2 * 1/2). With the query's own row
    # as a candidate it would be 5/6.
    assert result["recall_at_1"] == 0.75


def test_per_category_values_are_the_categories_queries() -> None:
    generator = torch.Generator().manual_seed(9)
    query, gallery = (
        torch.randn(10, 3, generator=generator),
        torch.randn(30, 3, generator=generator),
    )
    ids = (
        torch.randint(1, 5, (10,), generator=generator),
        torch.randint(1, 5, (30,), generator=generator),
    )
    cams = (torch.zeros(10, dtype=torch.long), torch.randint(0, 2, (30,), generator=generator))
    data = (query, gallery, ids, cams)
    result, _ = evaluate(data, single_gallery_shot=True, query_categories=torch.arange(10) % 2)
    per_query = result["per_query"]
    for category, metrics in result["per_category"].items():
        rows = (per_query.query_indices % 2) == category
        expected = per_query.values["recall_at_2"][rows].mean().item()
        assert metrics["recall_at_2"] == pytest.approx(expected, abs=1e-12)


def test_cmc_curve_stops_at_the_largest_rank_computed() -> None:
    data = _small_case()
    result, _ = evaluate(data, ("recall_at_2",), single_gallery_shot=True)
    assert len(cmc_curve(result["per_query"], 2)) == 2
    with pytest.raises(InvalidArgumentError, match="recall_at_3"):
        cmc_curve(result["per_query"], 3)


def _small_case():
    generator = torch.Generator().manual_seed(1)
    query, gallery = torch.randn(4, 3, generator=generator), torch.randn(10, 3, generator=generator)
    ids = (torch.tensor([1, 2, 1, 2]), torch.randint(1, 4, (10,), generator=generator))
    cams = (torch.zeros(4, dtype=torch.long), torch.randint(0, 2, (10,), generator=generator))
    return query, gallery, ids, cams


@pytest.mark.parametrize(
    ("options", "error", "name"),
    [
        ({"single_gallery_shot": 1}, TypeError, "'single_gallery_shot'"),
        ({"single_gallery_shot": "yes"}, TypeError, "'single_gallery_shot'"),
        ({"single_gallery_shot": None}, TypeError, "'single_gallery_shot'"),
        ({"single_gallery_shot_draws": 10}, ValueError, "'single_gallery_shot_draws'"),
        ({"single_gallery_shot": True, "single_gallery_shot_draws": 0}, ValueError, "draws'"),
        ({"single_gallery_shot": True, "single_gallery_shot_draws": 2.5}, TypeError, "draws'"),
        ({"single_gallery_shot": True, "single_gallery_shot_draws": True}, TypeError, "draws'"),
    ],
)
def test_bad_options_are_refused_by_name(options, error, name) -> None:
    with pytest.raises(error, match=name):
        evaluate(_small_case(), **options)


def test_a_custom_label_comparison_is_refused() -> None:
    query, gallery, ids, _ = _small_case()
    calculator = AccuracyCalculator(
        include=("recall_at_1",), label_comparison_fn=lambda a, b: a == b
    )
    with pytest.raises(InvalidArgumentError, match="label_comparison_fn"):
        calculator.get_accuracy(query, ids[0], gallery, ids[1], single_gallery_shot=True)
