"""recall_at_<K>, precision_at_<K>, mean_average_precision_at_<K>, ndcg_at_<K>.

Every value is checked against a brute-force oracle written plainly below: a loop over
queries, a stable sort of exact distances, and each metric's textbook definition.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.evaluation import AccuracyCalculator, PerQueryValues
from pytorch_metric_learning.evaluation.retrieval import metrics
from pytorch_metric_learning.evaluation.retrieval._metric_names import parse_metric_name

FAMILIES = ("recall", "precision", "mean_average_precision", "ndcg")


def brute_force_knn(query, k, reference=None, ref_includes_query=False):
    """Exact squared-Euclidean neighbours, ties broken by reference index (a stable sort)."""
    reference = query if reference is None else reference
    q, r = query.double().numpy(), reference.double().numpy()
    dist = ((q[:, None, :] - r[None, :, :]) ** 2).sum(-1)
    if ref_includes_query:
        dist[np.arange(len(q)), np.arange(len(q))] = np.inf
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return torch.from_numpy(np.take_along_axis(dist, order, 1)), torch.from_numpy(order)


def oracle(family, k, rel, big_r):
    """One query's value from its full relevance list (every reference, nearest first)."""
    top = rel[:k]
    if family == "recall":
        return float(any(top))
    if family == "precision":
        return sum(top) / k
    if family == "mean_average_precision":  # 2.x: (1/R) sum_{i<=k} P@i rel_i
        hits, total = 0, 0.0
        for i, r in enumerate(top, start=1):
            if r:
                hits += 1
                total += hits / i
        return total / big_r
    dcg = sum(1 / math.log2(i + 1) for i, r in enumerate(top, start=1) if r)
    ideal = sum(1 / math.log2(i + 1) for i in range(1, min(big_r, k) + 1))
    return dcg / ideal


def per_query_oracle(x, y, ref_x, ref_y, ref_includes_query, names):
    """{name: [(query index, label, value)]} over non-lone queries, by brute force."""
    _, order = brute_force_knn(x, len(ref_x) - int(ref_includes_query), ref_x, ref_includes_query)
    out = {name: [] for name in names}
    for qi in range(len(x)):
        label = int(y[qi])
        big_r = int((ref_y == label).sum()) - int(ref_includes_query)
        if big_r == 0:
            continue
        rel = [bool(ref_y[j] == label) for j in order[qi].tolist()]
        for name in names:
            metric = parse_metric_name(name)
            out[name].append((qi, label, oracle(metric.family, metric.k, rel, big_r)))
    return out


@st.composite
def retrieval_problem(draw):
    """Small integer-valued embeddings (many tied distances) and labels with lone queries."""
    n = draw(st.integers(2, 25))
    dims = draw(st.integers(1, 3))
    coords = draw(st.lists(st.integers(-2, 2), min_size=n * dims, max_size=n * dims))
    labels = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    x = torch.tensor(coords, dtype=torch.float32).reshape(n, dims)
    names = draw(
        st.lists(
            st.builds(
                lambda fam, k: f"{fam}_at_{k}", st.sampled_from(FAMILIES), st.integers(1, 30)
            ),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    return x, torch.tensor(labels), names


@settings(max_examples=60, deadline=None)
@given(problem=retrieval_problem(), mode=st.sampled_from(["self", "split", "includes"]))
def test_each_family_matches_a_brute_force_oracle(problem, mode):
    x, y, names = problem
    args, same = (x, y), True  # self: no reference, each query left out of its own search
    ref_x, ref_y = x, y
    if mode == "split" and len(x) > 3:  # a separate reference: the last third of the rows
        cut = 2 * len(x) // 3
        x, y, ref_x, ref_y, same = x[:cut], y[:cut], x[cut:], y[cut:], False
        args = (x, y, ref_x, ref_y)
    elif mode == "includes":  # an explicit reference that starts with the query
        args = (x, y, x.clone(), y.clone(), True)
    calc = AccuracyCalculator(include=tuple(names), knn_func=brute_force_knn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all-lone inputs warn
        got = calc.get_accuracy(*args, return_per_query=True)
    expected = per_query_oracle(x, y, ref_x, ref_y, same, names)
    per_query = got["per_query"]
    for name in names:
        rows = expected[name]
        assert per_query.query_indices.tolist() == [qi for qi, _, _ in rows]
        assert per_query.values[name].dtype == torch.float64
        assert per_query.values[name].tolist() == pytest.approx([v for _, _, v in rows])
        mean = float(np.mean([v for _, _, v in rows])) if rows else float("nan")
        assert got[name] == pytest.approx(mean, nan_ok=True)


@settings(max_examples=25, deadline=None)
@given(problem=retrieval_problem())
def test_avg_of_avgs_and_return_per_class_follow_the_oracle(problem):
    x, y, names = problem
    expected = per_query_oracle(x, y, x, y, True, names)
    if not expected[names[0]]:
        return
    per_class = AccuracyCalculator(
        include=tuple(names), return_per_class=True, knn_func=brute_force_knn
    )
    avg = AccuracyCalculator(include=tuple(names), avg_of_avgs=True, knn_func=brute_force_knn)
    got_lists, got_avgs = per_class.get_accuracy(x, y), avg.get_accuracy(x, y)
    for name in names:
        by_label = {}
        for _, label, value in expected[name]:
            by_label.setdefault(label, []).append(value)
        class_means = [float(np.mean(by_label[label])) for label in sorted(by_label)]
        assert got_lists[name] == pytest.approx(class_means)
        assert got_avgs[name] == pytest.approx(float(np.mean(class_means)))


def test_default_backend_matches_the_oracle_on_continuous_data():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(120, 6, generator=gen)
    y = torch.randint(0, 7, (120,), generator=gen)
    y[0] = 99  # a lone query
    names = ["recall_at_1", "recall_at_4", "precision_at_3", "ndcg_at_10",
             "mean_average_precision_at_8"]  # fmt: skip
    got = AccuracyCalculator(include=tuple(names)).get_accuracy(x, y)
    expected = per_query_oracle(x, y, x, y, True, names)
    for name in names:
        assert got[name] == pytest.approx(float(np.mean([v for _, _, v in expected[name]])))


def test_recall_at_1_equals_precision_at_1():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=gen)
    y = torch.randint(0, 20, (300,), generator=gen)
    include = ("precision_at_1", "recall_at_1")
    for kwargs in ({}, {"avg_of_avgs": True}, {"return_per_class": True}):
        got = AccuracyCalculator(include=include, **kwargs).get_accuracy(x, y)
        assert got["recall_at_1"] == got["precision_at_1"]


def twox_mean_average_precision(knn_labels, query_labels, ref_includes_query, ref_labels):
    """pytorch-metric-learning 2.x's mean_average_precision, restated plainly: precision at
    each relevant rank of the k retrieved, summed, divided by the query's R."""
    values = []
    for row, label in zip(knn_labels.tolist(), query_labels.tolist()):
        big_r = sum(1 for other in ref_labels.tolist() if other == label) - int(ref_includes_query)
        if big_r == 0:
            continue
        equal = [other == label for other in row]
        cumulative = np.cumsum(equal)
        precision_at_ks = [c * e / (i + 1) for i, (c, e) in enumerate(zip(cumulative, equal))]
        values.append(sum(precision_at_ks) / big_r)
    return float(np.mean(values))


@pytest.mark.parametrize("k", [1, 3, 10, 500])
def test_mean_average_precision_at_k_is_2x_mean_average_precision_with_k(k):
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(150, 5, generator=gen)
    y = torch.randint(0, 6, (150,), generator=gen)
    name = f"mean_average_precision_at_{k}"
    _, indices = brute_force_knn(x, min(k, 149), None, True)
    reference = twox_mean_average_precision(y[indices], y, True, y)
    assert AccuracyCalculator(include=(name,)).get_accuracy(x, y)[name] == pytest.approx(reference)
    ours = AccuracyCalculator(include=("mean_average_precision",), k=min(k, 149))
    assert ours.get_accuracy(x, y)["mean_average_precision"] == pytest.approx(reference)


class SpyKNN:
    def __init__(self):
        self.calls = []

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls.append(k)
        return brute_force_knn(query, k, reference, ref_includes_query)


@pytest.mark.parametrize(
    ("include", "expected_k"),
    [
        (("recall_at_4", "recall_at_16", "precision_at_1"), 16),
        (("ndcg_at_2", "mean_average_precision_at_3"), 3),
        (("recall_at_2", "r_precision"), 29),  # the largest R: 30 queries of one label
        (("recall_at_1000",), 59),  # clamped to the references that can be retrieved
    ],
)
def test_backend_is_asked_once_for_the_largest_k(include, expected_k):
    x = torch.randn(60, 3)
    y = torch.cat([torch.zeros(30), torch.arange(30) % 10 + 1]).long()
    spy = SpyKNN()
    AccuracyCalculator(include=include, knn_func=spy).get_accuracy(x, y)
    assert spy.calls == [expected_k]


def test_cutoff_above_the_reference_uses_every_reference():
    x, y = torch.randn(12, 2), torch.tensor([0, 1] * 6)
    got = AccuracyCalculator(
        include=("recall_at_50", "precision_at_50", "ndcg_at_50")
    ).get_accuracy(x, y)
    assert got["recall_at_50"] == 1.0
    assert got["precision_at_50"] == pytest.approx(5 / 50)  # 5 same-label others, divided by K
    assert got["ndcg_at_50"] <= 1.0


def test_every_query_lone_gives_nan_with_a_warning(caplog):
    x, y = torch.randn(5, 2), torch.arange(5)
    calc = AccuracyCalculator(include=("recall_at_2", "ndcg_at_3"))
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        got = calc.get_accuracy(x, y, return_per_query=True)
    assert "None of the query labels" in caplog.text
    assert math.isnan(got["recall_at_2"]) and math.isnan(got["ndcg_at_3"])
    assert len(got["per_query"]) == 0


def test_custom_label_comparison_with_parametrized_names():
    x = torch.randn(40, 3)
    labels = torch.stack([torch.arange(40) % 4, torch.arange(40) % 5], 1)

    def first_column(a, b):
        return a[..., 0] == b[..., 0]

    calc = AccuracyCalculator(include=("recall_at_3",), label_comparison_fn=first_column)
    expected = per_query_oracle(x, labels[:, 0], x, labels[:, 0], True, ["recall_at_3"])
    got = calc.get_accuracy(x, labels)["recall_at_3"]
    assert got == pytest.approx(float(np.mean([v for _, _, v in expected["recall_at_3"]])))


@pytest.mark.parametrize(
    "name", ["recall_at_0", "recall_at_k", "ndcg_at_-1", "recall_at_01", "mrr_at_5", "recall@1"]
)
def test_invalid_names_list_the_families(name):
    with pytest.raises(ValueError, match=r"recall_at_<K>.*ndcg_at_<K>"):
        AccuracyCalculator(include=(name,))
    with pytest.raises(ValueError, match=r"mean_average_precision_at_<K>"):
        AccuracyCalculator().get_accuracy(
            torch.randn(4, 2), torch.tensor([0, 0, 1, 1]), include=(name,)
        )


def test_names_are_kept_in_the_order_given_and_can_be_excluded():
    calc = AccuracyCalculator(
        include=("recall_at_8", "recall_at_1", "recall_at_4"), exclude=("recall_at_4",)
    )
    assert calc.get_curr_metrics() == ["recall_at_8", "recall_at_1"]
    got = calc.get_accuracy(torch.randn(20, 2), torch.arange(20) % 2)
    assert list(got) == ["recall_at_8", "recall_at_1"]


def test_per_query_values_slice_by_class_and_skip_clustering():
    x, y = torch.randn(50, 3), torch.arange(50) % 5
    y[7] = 42  # lone
    calc = AccuracyCalculator(include=("recall_at_2", "precision_at_1", "NMI", "r_precision"))
    got = calc.get_accuracy(x, y, return_per_query=True)
    per_query = got["per_query"]
    assert isinstance(per_query, PerQueryValues)
    assert 7 not in per_query.query_indices.tolist() and len(per_query) == 49
    assert torch.equal(per_query.query_labels, y[per_query.query_indices])
    assert set(per_query.values) == {"recall_at_2", "precision_at_1", "r_precision"}
    for name, values in per_query.values.items():
        assert values.dtype == torch.float64
        assert float(values.mean()) == pytest.approx(got[name])
    assert "per_query" not in calc.get_accuracy(x, y)


def test_tester_reports_parametrized_metrics():
    from torch.utils.data import TensorDataset

    from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

    x, y = torch.randn(40, 4), torch.arange(40) % 4
    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=AccuracyCalculator(include=("recall_at_1", "recall_at_4")),
        dataloader_num_workers=0,
        progress_bar=False,
        normalize_embeddings=False,
    )
    result = tester.test({"val": TensorDataset(x, y)}, 0, torch.nn.Identity())
    expected = per_query_oracle(x, y, x, y, True, ["recall_at_4"])["recall_at_4"]
    assert result["val"]["recall_at_4_level0"] == pytest.approx(
        float(np.mean([v for _, _, v in expected]))
    )


def test_hooks_accept_a_parametrized_primary_metric(tmp_path):
    from torch.utils.data import TensorDataset

    from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester
    from pytorch_metric_learning.utils import logging_presets

    x, y = torch.randn(40, 4), torch.arange(40) % 4
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="recall_at_2")
    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=AccuracyCalculator(include=("recall_at_2", "precision_at_1")),
        dataloader_num_workers=0,
        progress_bar=False,
        normalize_embeddings=False,
        end_of_testing_hook=hooks.end_of_testing_hook,
    )
    datasets = {"val": TensorDataset(x, y)}
    hooks.end_of_epoch_hook(tester, datasets, tmp_path / "models")  # validates the name
    tester.test(datasets, 1, torch.nn.Identity())
    expected = per_query_oracle(x, y, x, y, True, ["recall_at_2"])["recall_at_2"]
    best_epoch, best = hooks.get_best_epoch_and_accuracy(tester, "val")
    assert best_epoch == 1
    assert best == pytest.approx(float(np.mean([v for _, _, v in expected])))
    with pytest.raises(ValueError, match="primary_metric"):
        other = logging_presets.get_hook_container(record_keeper, primary_metric="recall_at_3")
        other.end_of_epoch_hook(tester, datasets, tmp_path / "models")


@pytest.mark.parametrize(
    "call",
    [
        lambda rel, r: metrics.recall_at_k(rel, 0),
        lambda rel, r: metrics.precision_at_k(rel, True),
        lambda rel, r: metrics.ndcg_at_k(rel, r, 2.0),
        lambda rel, r: metrics.recall_at_k(rel.long(), 1),
        lambda rel, r: metrics.mean_average_precision_at_k(rel, r * 0, 2),
        lambda rel, r: metrics.ndcg_at_k(rel, r.double(), 2),
    ],
)
def test_metric_functions_reject_bad_arguments(call):
    relevance, num_relevant = torch.tensor([[True, False]]), torch.tensor([1])
    with pytest.raises((ValueError, TypeError), match="parameter of"):
        call(relevance, num_relevant)


def test_ndcg_of_a_perfect_ranking_is_one():
    relevance = torch.tensor([[True, True, False], [True, False, False]])
    assert metrics.ndcg_at_k(relevance, torch.tensor([2, 1]), 3).tolist() == [1.0, 1.0]
    # R = 3 but only 2 of the first 3 relevant: DCG (1 + 1/log2 3) / IDCG (1 + 1/log2 3 + 1/2)
    ideal = 1 + 1 / math.log2(3) + 0.5
    got = metrics.ndcg_at_k(torch.tensor([[True, True, False]]), torch.tensor([3]), 3)
    assert got.item() == pytest.approx((1 + 1 / math.log2(3)) / ideal)
