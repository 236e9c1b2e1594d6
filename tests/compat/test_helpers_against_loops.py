"""The 2.x module-level helpers on random inputs against plain loops written out below."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.utils import accuracy_calculator as ac


def loop_metrics(knn_labels, query_labels, counts, ref_includes_query):
    """{metric: [(label, value), ...]} by plain loops, as the 2.x definitions read."""
    out = {"p1": [], "p3": [], "r_precision": [], "map_at_r": [], "map": [], "mrr": []}
    for i in range(len(query_labels)):
        label = int(query_labels[i])
        rel = [int(knn_labels[i][j]) == label for j in range(len(knn_labels[i]))]
        big_r = counts[label] - int(ref_includes_query)
        cut = min(big_r, len(rel))
        out["p1"].append((label, float(rel[0])))
        out["p3"].append((label, sum(rel[:3]) / 3))
        out["r_precision"].append((label, sum(rel[:cut]) / cut))
        hits, at_r = 0, 0.0
        for j in range(cut):
            hits += rel[j]
            at_r += rel[j] * hits / (j + 1)
        out["map_at_r"].append((label, at_r / big_r))
        hits, at_k = 0, 0.0
        for j in range(len(rel)):
            hits += rel[j]
            at_k += rel[j] * hits / (j + 1)
        out["map"].append((label, at_k / big_r))
        first = next((j for j in range(len(rel)) if rel[j]), None)
        out["mrr"].append((label, 0.0 if first is None else 1 / (first + 1)))
    return out


def averaged(pairs, avg_of_avgs, per_class):
    if not (avg_of_avgs or per_class):
        return sum(v for _, v in pairs) / len(pairs)
    by_label = {}
    for label, value in pairs:
        by_label.setdefault(label, []).append(value)
    means = [sum(v) / len(v) for _, v in sorted(by_label.items())]
    return means if per_class else sum(means) / len(means)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 25))
    k = draw(st.integers(3, 8))
    query_labels = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    knn = draw(
        st.lists(st.lists(st.integers(0, 5), min_size=k, max_size=k), min_size=n, max_size=n)
    )
    counts = {label: draw(st.integers(2, 10)) for label in sorted(set(query_labels))}
    return torch.tensor(knn), torch.tensor(query_labels), counts


@settings(max_examples=60, deadline=None)
@given(cases(), st.booleans(), st.sampled_from([(False, False), (True, False), (False, True)]))
def test_helpers_match_loops(case, ref_includes_query, averaging):
    knn_labels, query_labels, counts = case
    label_counts = (list(counts), list(counts.values()))
    want = loop_metrics(knn_labels.tolist(), query_labels.tolist(), counts, ref_includes_query)
    gt = query_labels[:, None]
    opts = (*averaging, ac.EQUALITY)
    args = (knn_labels, gt, ref_includes_query, label_counts, *averaging, ac.EQUALITY)
    got = {
        "p1": ac.precision_at_k(knn_labels, gt, 1, *opts),
        "p3": ac.precision_at_k(knn_labels, gt, 3, *opts),
        "r_precision": ac.r_precision(*args),
        "map_at_r": ac.mean_average_precision(*args, at_r=True),
        "map": ac.mean_average_precision(*args),
        "mrr": ac.mean_reciprocal_rank(knn_labels, gt, *opts),
    }
    for name, value in got.items():
        assert value == pytest.approx(averaged(want[name], *averaging), abs=1e-12), name


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=30),
    st.lists(st.integers(0, 6), min_size=1, max_size=30),
    st.booleans(),
)
def test_label_statistics_match_loops(query, reference, ref_includes_query):
    query_labels = torch.tensor(query)
    reference_labels = torch.tensor(query + reference if ref_includes_query else reference)
    unique, counts = ac.get_label_match_counts(query_labels, reference_labels, ac.EQUALITY)
    labels = sorted(set(query))
    want_counts = [reference_labels.tolist().count(label) for label in labels]
    assert (unique.tolist(), counts.tolist()) == (labels, want_counts)
    lone, mask = ac.get_lone_query_labels(
        query_labels, (unique, counts), ref_includes_query, ac.EQUALITY
    )
    own = int(ref_includes_query)
    want_lone = [label for label, count in zip(labels, want_counts) if count - own <= 0]
    assert lone.tolist() == want_lone
    assert mask.tolist() == [label not in want_lone for label in query]
    knn = torch.zeros(len(query), 1, dtype=torch.long)
    kept, _ = ac.try_getting_not_lone_labels(knn, query_labels, mask)
    assert (kept is None) == (not any(mask.tolist()))
    if kept is None:
        assert math.isnan(ac.nan_accuracy(unique, False))
