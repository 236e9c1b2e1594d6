"""The worst queries under every protocol: what the table shows is what the metric saw.

Class: every view of the per-query results (the worst queries' table and picture) uses
exactly the candidates the metrics used. For random protocols (camera groups, junk and
distractor labels, excluded pairs, one set with query/reference roles, single-gallery-shot)
the worst table's queries, ranks, relevance and values equal a plain re-identification loop
written here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.worst_queries import find_worst_queries, worst_queries_rows

# hypothesis may give the queries cameras that no gallery image has (a warning says so)
pytestmark = pytest.mark.filterwarnings("ignore:No query group occurs")
JUNK, DISTRACTOR = -1, 0


@st.composite
def protocols(draw):
    """``(inputs, protocol kwargs, metric, the oracle's query rows and reference rows)``."""
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    one_set = draw(st.booleans())
    num_query = draw(st.integers(2, 20))
    num_gallery = num_query if one_set else draw(st.integers(3, 40))
    num_ids = draw(st.integers(1, 5))
    cameras = draw(st.integers(1, 3))
    query = torch.randn(num_query, 4, generator=generator, dtype=torch.float64)
    gallery = query if one_set else torch.randn(num_gallery, 4, generator=generator).double()
    query_ids = torch.randint(1, num_ids + 1, (num_query,), generator=generator)
    low = DISTRACTOR if one_set else JUNK
    gallery_ids = (
        query_ids.clone()
        if one_set
        else torch.randint(low, num_ids + 1, (num_gallery,), generator=generator)
    )
    if one_set and draw(st.booleans()):  # some distractors in the one set too
        gallery_ids[torch.rand(num_query, generator=generator) < 0.2] = DISTRACTOR
        query_ids = gallery_ids
    query_cams = torch.randint(0, cameras, (num_query,), generator=generator)
    gallery_cams = query_cams if one_set else torch.randint(0, cameras, (num_gallery,))
    protocol = {}
    if draw(st.booleans()):
        protocol["query_groups"] = query_cams
        if not one_set:
            protocol["reference_groups"] = gallery_cams
    if not one_set and draw(st.booleans()):
        protocol["junk_labels"] = (JUNK,)
    if draw(st.booleans()):
        protocol["distractor_labels"] = (DISTRACTOR,)
    num_pairs = draw(st.integers(0, 8))
    if num_pairs:
        protocol["excluded_pairs"] = torch.stack(
            [
                torch.randint(0, num_query, (num_pairs,), generator=generator),
                torch.randint(0, num_gallery, (num_pairs,), generator=generator),
            ],
            dim=1,
        )
    query_rows, reference_rows = list(range(num_query)), list(range(num_gallery))
    if one_set:
        is_query = torch.rand(num_query, generator=generator) < 0.7
        is_reference = torch.rand(num_query, generator=generator) < 0.8
        is_query[0], is_reference[-1] = True, True
        protocol["is_query"], protocol["is_reference"] = is_query, is_reference
        query_rows = is_query.nonzero().flatten().tolist()
        reference_rows = is_reference.nonzero().flatten().tolist()
    single_shot = draw(st.booleans())
    if single_shot:
        protocol["single_gallery_shot"] = True
    metrics = ["precision_at_1"] if single_shot else ["precision_at_1", "recall_at_2"]
    metric = draw(st.sampled_from(metrics))
    reference = (None, None) if one_set else (gallery, gallery_ids)
    inputs = (query, query_ids, *reference)
    labels = (query_ids, gallery_ids)
    data = (query, gallery, labels, query_cams, gallery_cams)
    return inputs, protocol, metric, (query_rows, reference_rows), data


def _brute_force(protocol, metric, rows, data):
    """Per non-left-out query: ``(row, value, candidates nearest first, relevant flags)``."""
    query_rows, reference_rows = rows
    query, gallery, (query_ids, gallery_ids), query_cams, gallery_cams = data
    one_set = "is_query" in protocol
    groups = "query_groups" in protocol
    junk = set(protocol.get("junk_labels", ()))
    distractors = set(protocol.get("distractor_labels", ()))
    pairs = {tuple(pair) for pair in protocol.get("excluded_pairs", torch.zeros(0, 2)).tolist()}
    found = []
    for q in query_rows:
        candidates = []
        for j in reference_rows:
            same_label = int(gallery_ids[j]) == int(query_ids[q])
            if one_set and j == q:
                continue
            if groups and same_label and int(gallery_cams[j]) == int(query_cams[q]):
                continue
            if int(gallery_ids[j]) in junk or (q, j) in pairs:
                continue
            distance = float(((gallery[j] - query[q]) ** 2).sum())
            candidates.append((distance, j))
        candidates.sort()
        order = [j for _, j in candidates]
        relevant = [
            int(gallery_ids[j]) == int(query_ids[q]) and int(gallery_ids[j]) not in distractors
            for j in order
        ]
        if not any(relevant):
            continue  # left out: no valid relevant reference
        found.append((q, _value(metric, protocol, order, relevant, gallery_ids), order, relevant))
    return found


def _value(metric, protocol, order, relevant, gallery_ids):
    if not protocol.get("single_gallery_shot"):
        return float(any(relevant[: 1 if metric == "precision_at_1" else 2]))
    # single shot: one candidate per identity drawn uniformly; P(the query's identity first)
    identities = [int(gallery_ids[j]) for j in order]
    own = identities[relevant.index(True)]
    sizes = {i: identities.count(i) for i in set(identities)}
    chance = 0.0
    for position, identity in enumerate(identities):
        if identity != own:
            continue
        ahead = {i: identities[:position].count(i) for i in sizes if i != own}
        survive = 1.0
        for i, count in ahead.items():
            survive *= 1.0 - count / sizes[i]
        chance += survive / sizes[own]
    return chance


@settings(max_examples=30, deadline=None)
@given(protocols())
def test_the_worst_table_is_a_brute_force_reid_loop(case):
    inputs, protocol, metric, rows, data = case
    worst = find_worst_queries(*inputs, metric=metric, num_queries=50, k=4, **protocol)
    oracle = _brute_force(protocol, metric, rows, data)
    # sorted by value, ties in query order (a stable sort), values to rounding
    assert len(worst) == len(oracle)
    by_row = {row: (value, order, relevant) for row, value, order, relevant in oracle}
    values = [item.value for item in worst]
    assert values == sorted(values)
    for item in worst:
        value, order, relevant = by_row[item.index]
        assert item.value == pytest.approx(value, abs=1e-9)
        assert [r.index for r in item.retrievals] == order[:4]
        assert [r.rank for r in item.retrievals] == list(range(1, len(order[:4]) + 1))
        assert [r.relevant for r in item.retrievals] == relevant[:4]
        assert item.nearest_relevant.rank == relevant.index(True) + 1
        assert item.nearest_relevant.index == order[relevant.index(True)]
    shown = {(row[0], row[4]) for row in worst_queries_rows(worst)}
    for row, reference in shown:  # no row of the table is a non-candidate
        assert reference in by_row[row][1]


@pytest.mark.parametrize(
    "bad",
    [
        {"single_gallery_shot": True, "single_gallery_shot_draws": 0},
        {"single_gallery_shot": True, "single_gallery_shot_draws": 1.5},
        {"query_groups": torch.tensor([0, 1, 0])},  # one side only, and the wrong length
        {"query_groups": torch.tensor([0.5] * 6), "reference_groups": torch.tensor([0] * 6)},
    ],
)
def test_refusals_name_find_worst_queries(bad) -> None:
    query, labels = torch.arange(6.0).reshape(6, 1), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises((ValueError, TypeError)) as raised:
        find_worst_queries(query, labels, query.clone(), labels.clone(), **bad)
    assert "find_worst_queries" in str(raised.value)
    assert "AccuracyCalculator.get_accuracy" not in str(raised.value)


def test_a_protocol_warning_is_given_once() -> None:
    query, labels = torch.arange(6.0).reshape(6, 1), torch.tensor([0, 0, 1, 1, 2, 2])
    groups = {
        "query_groups": torch.zeros(6, dtype=torch.long),
        "reference_groups": torch.ones(6, dtype=torch.long) + 4,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        find_worst_queries(query, labels, query.clone(), labels.clone(), num_queries=2, **groups)
    texts = [str(item.message) for item in caught]
    assert len(texts) == len(set(texts)), texts
