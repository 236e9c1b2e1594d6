"""AccuracyCalculator against a brute-force oracle written out plainly below."""

from __future__ import annotations

import gc
import logging
import math
import warnings
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import AccuracyCalculator, CustomKNN, TorchKMeans
from pytorch_metric_learning.utils import accuracy_calculator as legacy

KNN_METRICS = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
)
ALL_METRICS = (*KNN_METRICS, "NMI", "AMI")


# ----- the oracle -----


def oracle_per_query(query, query_labels, reference, reference_labels, ref_includes_query, k, same):
    """{metric: [(label key, value), ...]} over non-lone queries, by plain loops.

    ``k`` is the int/None/"max_bin_count" setting; neighbours come from sorting float64
    Euclidean distances (the data has no ties).
    """
    distances = torch.cdist(query.double(), reference.double())
    nq, nr = len(query), len(reference)
    relevant_counts = []
    for i in range(nq):
        count = 0
        for j in range(nr):
            if ref_includes_query and j == i:
                continue
            if same(query_labels[i], reference_labels[j]):
                count += 1
        relevant_counts.append(count)
    max_bin = max(relevant_counts)
    available = nr - 1 if ref_includes_query else nr
    if k is None:
        k_r, k_all = max_bin, available
    elif k == "max_bin_count":
        k_r, k_all = max_bin, max_bin
    else:
        k_r, k_all = min(k, max_bin), min(k, available)
    out = {name: [] for name in KNN_METRICS}
    for i in range(nq):
        big_r = relevant_counts[i]
        if big_r == 0:
            continue
        order = sorted(range(nr), key=lambda j: float(distances[i, j]))
        if ref_includes_query:
            order = [j for j in order if j != i]
        rel = [bool(same(query_labels[i], reference_labels[j])) for j in order]
        key = tuple(np.atleast_1d(query_labels[i].numpy()).tolist())
        out["precision_at_1"].append((key, float(rel[0])))
        cutoff = min(big_r, k_r)
        out["r_precision"].append((key, sum(rel[:cutoff]) / cutoff))
        out["mean_average_precision_at_r"].append((key, average_precision(rel, cutoff) / big_r))
        out["mean_average_precision"].append((key, average_precision(rel, k_all) / big_r))
        first = next((n for n in range(k_all) if rel[n]), None)
        out["mean_reciprocal_rank"].append((key, 0.0 if first is None else 1 / (first + 1)))
    return out


def average_precision(rel, cutoff):
    total, hits = 0.0, 0
    for n in range(cutoff):
        if rel[n]:
            hits += 1
            total += hits / (n + 1)
    return total


def aggregate(pairs, mode):
    if not pairs:
        return math.nan
    if mode == "mean":
        return sum(value for _, value in pairs) / len(pairs)
    by_label = {}
    for key, value in pairs:
        by_label.setdefault(key, []).append(value)
    per_class = [sum(v) / len(v) for _, v in sorted(by_label.items())]
    return per_class if mode == "per_class" else sum(per_class) / len(per_class)


def expected(
    query,
    query_labels,
    reference=None,
    reference_labels=None,
    ref_includes_query=False,
    k=None,
    same=None,
    mode="mean",
):
    if reference is None:
        reference, reference_labels, ref_includes_query = query, query_labels, True
    same = same or (lambda a, b: bool(torch.equal(a, b)))
    per_query = oracle_per_query(
        query, query_labels, reference, reference_labels, ref_includes_query, k, same
    )
    return {name: aggregate(pairs, mode) for name, pairs in per_query.items()}


def assert_close(got, want):
    for name, value in want.items():
        if isinstance(value, list):
            assert got[name] == pytest.approx(value, abs=1e-12), name
        elif math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == pytest.approx(value, abs=1e-12), name


def clustered(n, num_labels, dims=6, seed=0, dtype=torch.float64):
    """Float64 by default, so that no two distances tie at the search's precision."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_labels, (n,), generator=generator)
    centers = torch.randn(num_labels, dims, generator=generator, dtype=torch.float64)
    x = centers[labels] + 0.8 * torch.randn(n, dims, generator=generator, dtype=torch.float64)
    return x.to(dtype), labels


def knn_calc(**kwargs):
    return AccuracyCalculator(include=KNN_METRICS, **kwargs)


# ----- correctness against the oracle -----


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("k", [None, "max_bin_count", 4, 1000])
def test_self_retrieval(k, dtype):
    x, y = clustered(150, 8, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = knn_calc(k=k).get_accuracy(x, y)
    assert_close(got, expected(x, y, k=k))


@pytest.mark.parametrize("k", [None, "max_bin_count", 3])
def test_separate_reference(k):
    q, qy = clustered(80, 6, seed=1)
    r, ry = clustered(130, 6, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = knn_calc(k=k).get_accuracy(q, qy, r, ry)
    assert_close(got, expected(q, qy, r, ry, k=k))


def test_reference_containing_query_plus_more_rows():
    q, qy = clustered(70, 5, seed=2)
    extra, extra_y = clustered(90, 5, seed=3)
    r, ry = torch.cat([q, extra]), torch.cat([qy, extra_y])
    got = knn_calc().get_accuracy(q, qy, r, ry, ref_includes_query=True)
    assert_close(got, expected(q, qy, r, ry, ref_includes_query=True))


def test_lone_labels_are_left_out():
    x, y = clustered(100, 6, seed=4)
    y[:3] = torch.tensor([100, 101, 102])  # singletons: lone in self-retrieval
    got = knn_calc().get_accuracy(x, y)
    assert_close(got, expected(x, y))
    q, qy = clustered(60, 6, seed=5)
    qy[:10] = 77  # absent from the reference
    r, ry = clustered(90, 6, seed=6)
    assert_close(knn_calc().get_accuracy(q, qy, r, ry), expected(q, qy, r, ry))


@pytest.mark.parametrize("mode", ["avg_of_avgs", "per_class"])
def test_avg_of_avgs_and_per_class(mode):
    x, y = clustered(160, 7, seed=7)
    y[:2] = torch.tensor([50, 51])  # lone labels are not classes of the result
    options = {"avg_of_avgs": True} if mode == "avg_of_avgs" else {"return_per_class": True}
    got = knn_calc(**options).get_accuracy(x, y)
    assert_close(got, expected(x, y, mode=mode))
    if mode == "per_class":
        assert len(got["precision_at_1"]) == 7


def either_column(a, b):
    same_first = a[..., 0] == b[..., 0]
    return same_first & ((a[..., 1] != b[..., 1]) | (a[..., 1] == 1))


@pytest.mark.parametrize("ref_includes_query", [True, False])
def test_two_dimensional_labels_with_custom_comparison(ref_includes_query):
    """R counts the query itself only when the function says its label matches itself."""
    x, first = clustered(120, 4, seed=8)
    second = torch.randint(0, 3, (120,), generator=torch.Generator().manual_seed(9))
    y = torch.stack([first, second], dim=1)
    calc = knn_calc(label_comparison_fn=either_column)
    same = lambda a, b: bool(either_column(a, b))  # noqa: E731
    if ref_includes_query:
        got = calc.get_accuracy(x, y)
        want = expected(x, y, same=same)
    else:
        q, qy, r, ry = x[:50], y[:50], x[50:], y[50:]
        got = calc.get_accuracy(q, qy, r, ry)
        want = expected(q, qy, r, ry, same=same)
    assert_close(got, want)


def test_two_dimensional_labels_with_equality_compare_rows():
    x, first = clustered(90, 3, seed=10)
    y = torch.stack([first, torch.arange(90) % 2], dim=1)
    got = knn_calc(return_per_class=True).get_accuracy(x, y)
    assert_close(got, expected(x, y, mode="per_class"))


@given(
    n=st.integers(2, 40),
    num_labels=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    k=st.sampled_from([None, "max_bin_count", 1, 2, 5, 50]),
    separate=st.booleans(),
)
def test_random_inputs_match_the_oracle(n, num_labels, seed, k, separate):
    x, y = clustered(n, num_labels, dims=3, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if separate and n > 2:
            split = n // 2
            got = knn_calc(k=k).get_accuracy(x[:split], y[:split], x[split:], y[split:])
            want = expected(x[:split], y[:split], x[split:], y[split:], k=k)
        else:
            got = knn_calc(k=k).get_accuracy(x, y)
            want = expected(x, y, k=k)
    assert_close(got, want)


def test_all_lone_is_nan_with_a_logged_warning(caplog):
    x = torch.randn(5, 3)
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        got = knn_calc().get_accuracy(x, torch.arange(5))
    assert "None of the query labels" in caplog.text
    assert all(math.isnan(got[name]) for name in KNN_METRICS)
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        per_class = knn_calc(return_per_class=True).get_accuracy(x, torch.arange(5))
    assert len(per_class["r_precision"]) == 5
    assert all(math.isnan(v) for v in per_class["r_precision"])


def test_labels_are_never_cast_to_float():
    """2**24 and 2**24 + 1 are one float32 value; they must stay distinct labels."""
    x = torch.tensor([[0.0], [0.1], [10.0], [10.1]])
    big = 2**24
    y = torch.tensor([big, big + 1, big, big + 1])
    got = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(x, y)
    assert got["precision_at_1"] == 0.0


def test_nmi_and_ami_equal_scikit_learn_on_the_clusters():
    x, y = clustered(200, 6, seed=11)
    recorded = {}

    def kmeans(data, num_clusters):
        recorded["num_clusters"] = num_clusters
        recorded["clusters"] = TorchKMeans(seed=1)(data, num_clusters)
        return recorded["clusters"]

    got = AccuracyCalculator(include=("NMI", "AMI"), kmeans_func=kmeans).get_accuracy(x, y)
    assert recorded["num_clusters"] == len(y.unique())
    clusters = recorded["clusters"].numpy()
    assert got["NMI"] == pytest.approx(normalized_mutual_info_score(y.numpy(), clusters), abs=1e-9)
    assert got["AMI"] == pytest.approx(adjusted_mutual_info_score(y.numpy(), clusters), abs=1e-9)


def test_default_metrics_and_metrics_on_request():
    x, y = clustered(60, 4)
    assert set(AccuracyCalculator().get_accuracy(x, y)) == {
        "precision_at_1",
        "r_precision",
        "mean_average_precision_at_r",
        "NMI",
        "AMI",
    }
    got = AccuracyCalculator(include=("mean_reciprocal_rank",)).get_accuracy(x, y)
    assert set(got) == {"mean_reciprocal_rank"}
    assert got["mean_reciprocal_rank"] == pytest.approx(expected(x, y)["mean_reciprocal_rank"])


def test_numpy_inputs_are_accepted():
    x, y = clustered(50, 4)
    got = knn_calc().get_accuracy(x.numpy(), y.numpy())
    assert_close(got, expected(x, y))


# ----- the k the backend is asked for -----


class SpyKNN:
    """Records the k of every call and whether gradients were enabled; keeps no outputs."""

    def __init__(self):
        self.calls = []
        self.inner = CustomKNN(LpDistance(normalize_embeddings=False, power=2))

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        self.calls.append((k, torch.is_grad_enabled(), ref_includes_query))
        return self.inner(query, k, reference, ref_includes_query)


def spy_k(include, k=None, data=None):
    x, y = data if data is not None else clustered(100, 5, seed=12)
    spy = SpyKNN()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AccuracyCalculator(include=include, k=k, knn_func=spy).get_accuracy(x, y)
    assert len(spy.calls) <= 1
    return spy.calls[0][0] if spy.calls else None


def max_bin(y):
    return int(torch.bincount(y).max()) - 1  # self-retrieval


@pytest.mark.parametrize(
    ("include", "k", "want"),
    [
        (("precision_at_1",), None, lambda y: 1),
        (("precision_at_1",), 7, lambda y: 1),
        (("r_precision",), None, max_bin),
        (("mean_average_precision_at_r",), "max_bin_count", max_bin),
        (("r_precision", "precision_at_1"), 3, lambda y: 3),
        (("r_precision",), 1000, max_bin),
        (("mean_average_precision",), None, lambda y: len(y) - 1),
        (("mean_average_precision",), 5, lambda y: 5),
        (("mean_average_precision",), "max_bin_count", max_bin),
        (("mean_reciprocal_rank",), None, lambda y: len(y) - 1),
        (("mean_reciprocal_rank",), 1000, lambda y: len(y) - 1),
        ((), None, max_bin),
        (("NMI", "AMI"), None, lambda y: None),
    ],
)
def test_backend_is_asked_for_what_the_metrics_need(include, k, want):
    data = clustered(100, 5, seed=12)
    assert spy_k(include, k, data) == want(data[1])


def test_backend_is_called_once_without_gradients():
    x, y = clustered(40, 3)
    x.requires_grad_(True)
    spy = SpyKNN()
    AccuracyCalculator(include=KNN_METRICS, knn_func=spy, k=5).get_accuracy(x, y)
    assert spy.calls == [(5, False, True)]


def test_all_lone_does_not_search():
    spy = SpyKNN()
    knn_calc(knn_func=spy).get_accuracy(torch.randn(4, 2), torch.arange(4))
    assert spy.calls == []


def test_small_k_for_r_metrics_is_logged_as_a_warning_as_in_2x(caplog):
    x, y = clustered(100, 5)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")  # a log record, not a UserWarning
        AccuracyCalculator(include=("precision_at_1",), k=2).get_accuracy(x, y)
        assert caplog.records == []
        AccuracyCalculator(include=("r_precision",), k=2).get_accuracy(x, y)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.name.startswith("pytorch_metric_learning.")
    assert "max_bin_count" in record.getMessage() and "k=2" in record.getMessage()


def test_large_int_k_is_clamped_with_a_warning_for_every_backend():
    x, y = clustered(30, 3)
    spy = SpyKNN()
    calc = AccuracyCalculator(include=("mean_average_precision",), k=100, knn_func=spy)
    with pytest.warns(UserWarning, match="using k=29") as record:
        got = calc.get_accuracy(x, y)
    assert record[0].filename == __file__
    assert spy.calls[0][0] == 29
    assert got["mean_average_precision"] == pytest.approx(
        expected(x, y, k=100)["mean_average_precision"]
    )


# ----- validation of the backend's output and of the inputs -----


def returning(result_fn):
    def knn(query, k, reference=None, ref_includes_query=False):
        return result_fn(len(query), k, len(reference))

    return knn


@pytest.mark.parametrize(
    "bad",
    [
        lambda nq, k, nr: (torch.zeros(nq, k + 1), torch.zeros(nq, k + 1, dtype=torch.long)),
        lambda nq, k, nr: (torch.zeros(nq, k), torch.zeros(nq - 1, k, dtype=torch.long)),
        lambda nq, k, nr: (torch.zeros(nq, k), torch.full((nq, k), nr, dtype=torch.long)),
        lambda nq, k, nr: (torch.zeros(nq, k), torch.full((nq, k), -1, dtype=torch.long)),
        lambda nq, k, nr: (torch.zeros(nq, k), torch.zeros(nq, k)),
        lambda nq, k, nr: torch.zeros(nq, k, dtype=torch.long),
    ],
)
def test_bad_backend_output_raises_value_error(bad):
    x, y = clustered(20, 2)
    with pytest.raises(ValueError, match="knn_func"):
        knn_calc(knn_func=returning(bad)).get_accuracy(x, y)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_embeddings_raise_value_error_that_says_so(value):
    x, y = clustered(20, 2)
    x[3, 1] = value
    with pytest.raises(ValueError, match="NaN or infinite"):
        AccuracyCalculator().get_accuracy(x, y)
    with pytest.raises(ValueError, match="NaN or infinite"):
        AccuracyCalculator().get_accuracy(torch.randn(5, 6), y[:5], x, y)


def test_reference_must_start_with_the_query():
    q, qy = clustered(10, 2)
    r, ry = clustered(20, 2, seed=3)
    with pytest.raises(ValueError, match="ref_includes_query"):
        knn_calc().get_accuracy(q, qy, r, ry, ref_includes_query=True)
    r2, ry2 = torch.cat([q, r]), torch.cat([qy + 1, ry])
    with pytest.raises(ValueError, match="ref_includes_query"):
        knn_calc().get_accuracy(q, qy, r2, ry2, ref_includes_query=True)


def test_mismatched_inputs_raise():
    x, y = clustered(10, 2)
    with pytest.raises(ValueError, match="query_labels"):
        knn_calc().get_accuracy(x, y[:9])
    with pytest.raises(ValueError, match="reference_labels"):
        knn_calc().get_accuracy(x, y, x)
    with pytest.raises(ValueError, match="columns"):
        knn_calc().get_accuracy(x, y, torch.randn(10, 3), y)
    with pytest.raises(TypeError):
        knn_calc().get_accuracy(x, [0] * 10)


@pytest.mark.parametrize("k", [0, -1, 1.5, "foo", True])
def test_invalid_k(k):
    with pytest.raises(ValueError, match="'k' parameter of AccuracyCalculator"):
        AccuracyCalculator(k=k)


def test_invalid_k_message():
    with pytest.raises(ValueError) as error:
        AccuracyCalculator(k=0)
    assert str(error.value) == (
        "The 'k' parameter of AccuracyCalculator must be a positive int, None or "
        "'max_bin_count'. Got 0 instead."
    )


def test_invalid_options():
    with pytest.raises(ValueError):
        AccuracyCalculator(avg_of_avgs=True, return_per_class=True)
    with pytest.raises(ValueError):
        AccuracyCalculator(include=("precision_at_0",))
    with pytest.raises(TypeError):
        AccuracyCalculator(include="precision_at_1")


def test_custom_comparison_with_clustering_is_an_error():
    with pytest.raises(ValueError, match="clustering"):
        AccuracyCalculator(label_comparison_fn=either_column)
    with pytest.raises(NotImplementedError):  # as 2.x raised
        AccuracyCalculator(include=("NMI",), label_comparison_fn=either_column)
    calc = AccuracyCalculator(exclude=("NMI", "AMI"), label_comparison_fn=either_column)
    x, y = clustered(10, 2)
    with pytest.raises(ValueError, match="clustering"):
        calc.get_accuracy(x, torch.stack([y, y], 1), include=("AMI",))


def test_per_call_include_and_exclude_do_not_change_state():
    x, y = clustered(60, 3)
    calc = AccuracyCalculator()
    before = calc.get_curr_metrics()
    assert set(calc.get_accuracy(x, y, include=("precision_at_1",))) == {"precision_at_1"}
    assert "NMI" not in calc.get_accuracy(x, y, exclude=("NMI",))
    assert calc.get_curr_metrics() == before
    assert set(calc.get_accuracy(x, y)) == set(before)
    got = calc.get_accuracy(x, y, include=("mean_average_precision",))
    assert set(got) == {"mean_average_precision"}


def test_knn_outputs_are_released_before_returning():
    x, y = clustered(50, 3)
    refs = []

    def knn(query, k, reference=None, ref_includes_query=False):
        distances, indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(
            query, k, reference, ref_includes_query
        )
        refs.extend([weakref.ref(distances), weakref.ref(indices)])
        return distances, indices

    calc = AccuracyCalculator(knn_func=knn)
    calc.get_accuracy(x, y)
    gc.collect()
    assert refs and all(ref() is None for ref in refs)


def test_backend_specs_and_defaults():
    calc = AccuracyCalculator()
    assert isinstance(calc.knn_func, CustomKNN) and calc.knn_func.batch_size is None
    distance = calc.knn_func.distance
    assert isinstance(distance, LpDistance)
    assert (distance.normalize_embeddings, distance.power) == (False, 2)
    assert isinstance(calc.kmeans_func, TorchKMeans)
    cosine = AccuracyCalculator(knn_func={"name": "custom", "distance": "cosine"})
    assert cosine.knn_func.distance.is_inverted
    assert isinstance(AccuracyCalculator(kmeans_func="torch").kmeans_func, TorchKMeans)
    with pytest.raises(ValueError, match="Unknown knn backend"):
        AccuracyCalculator(knn_func="no_such_backend")


def test_device_option_keeps_results():
    x, y = clustered(40, 3)
    assert knn_calc(device="cpu").get_accuracy(x, y) == knn_calc().get_accuracy(x, y)


# ----- code written for 2.x -----


class LegacyCalculator(legacy.AccuracyCalculator):
    def calculate_precision_at_2(self, knn_labels, query_labels, **kwargs):
        return legacy.precision_at_k(
            knn_labels,
            query_labels[:, None],
            2,
            self.avg_of_avgs,
            self.return_per_class,
            self.label_comparison_fn,
        )

    def calculate_fancy_mutual_info(self, query_labels, cluster_labels, **kwargs):
        return float(len(torch.unique(cluster_labels)))

    def calculate_num_lone(self, not_lone_query_mask, label_counts, lone_query_labels, **kwargs):
        return int((~not_lone_query_mask).sum()), len(label_counts[0]), len(lone_query_labels)

    def requires_knn(self):
        return super().requires_knn() + ["precision_at_2", "num_lone"]

    def requires_clustering(self):
        return super().requires_clustering() + ["fancy_mutual_info"]


def test_subclass_metrics_of_2x_are_computed():
    x, y = clustered(80, 4, seed=13)
    y[0] = 99  # one lone query
    calc = LegacyCalculator(k=5)
    got = calc.get_accuracy(x, y)
    assert {"precision_at_2", "fancy_mutual_info", "num_lone", "NMI"} <= set(got)
    distances = torch.cdist(x.double(), x.double())
    distances.fill_diagonal_(float("inf"))
    nearest = distances.argsort(dim=1)[:, :2]
    want = sum(float((y[nearest[i]] == y[i]).sum()) / 2 for i in range(80)) / 80
    assert got["precision_at_2"] == pytest.approx(want)
    assert got["fancy_mutual_info"] == len(y.unique())
    assert got["num_lone"] == (1, len(y.unique()), 1)


def test_subclass_knn_metric_gets_k_or_every_reference():
    x, y = clustered(50, 3)
    spy = SpyKNN()
    LegacyCalculator(include=("precision_at_2",), knn_func=spy).get_accuracy(x, y)
    assert spy.calls[0][0] == 49
    spy = SpyKNN()
    LegacyCalculator(include=("precision_at_2",), k=4, knn_func=spy).get_accuracy(x, y)
    assert spy.calls[0][0] == 4


def test_overridden_builtin_receives_2x_arguments():
    class Override(legacy.AccuracyCalculator):
        def calculate_precision_at_1(self, knn_labels, query_labels, not_lone_query_mask, **kw):
            knn_labels, query_labels = legacy.try_getting_not_lone_labels(
                knn_labels, query_labels, not_lone_query_mask
            )
            return legacy.precision_at_k(knn_labels, query_labels[:, None], 1, False, False)

    x, y = clustered(70, 4, seed=14)
    got = Override(include=("precision_at_1",)).get_accuracy(x, y)
    assert got["precision_at_1"] == pytest.approx(expected(x, y)["precision_at_1"])


def test_default_search_is_euclidean_without_normalization():
    """The seed: defaults to CustomKNN(LpDistance(normalize_embeddings=False, power=2))."""
    query = torch.tensor([[1.0, 0.0]])
    reference = torch.tensor([[10.0, 1.0], [0.5, 0.5]])  # cosine-nearest, Euclidean-nearest
    calc = AccuracyCalculator(include=("precision_at_1",))
    got = calc.get_accuracy(query, torch.tensor([0]), reference, torch.tensor([0, 1]))
    assert got["precision_at_1"] == 0.0


def test_docstring_examples():
    import doctest

    from pytorch_metric_learning.evaluation.retrieval import accuracy_calculator as module

    assert doctest.testmod(module, raise_on_error=False).failed == 0


def test_compat_docstring_examples():
    import doctest

    from pytorch_metric_learning.evaluation.retrieval import _compat, _label_stats

    assert doctest.testmod(_compat).failed == 0
    assert doctest.testmod(_label_stats).failed == 0


@pytest.mark.faiss
def test_faiss_backends_by_name_give_the_same_knn_metrics():
    x, y = clustered(300, 6, seed=15)
    ours = knn_calc().get_accuracy(x, y)
    faiss_knn = knn_calc(knn_func="faiss").get_accuracy(x, y)
    assert faiss_knn == pytest.approx(ours, abs=1e-12)
    got = AccuracyCalculator(include=("NMI", "AMI"), kmeans_func="faiss").get_accuracy(x, y)
    assert 0.0 <= got["NMI"] <= 1.0


@pytest.mark.parametrize("scale", [2.0**80, 2.0**-90, 1e20, 1e-25])
def test_embeddings_at_the_edges_of_float32_get_the_unscaled_metrics(scale) -> None:
    """Squared distances of such embeddings overflow or underflow float32; the search and
    the k-means both rescale by a power of two, so every default metric is unchanged."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 8, (600,), generator=generator)
    centers = torch.randn(8, 16, generator=generator)
    x = centers[labels] + 0.8 * torch.randn(600, 16, generator=generator)
    x = x / x.abs().max()
    expected = AccuracyCalculator().get_accuracy(x, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 1e20: distances returned as inf
        found = AccuracyCalculator().get_accuracy(x * scale, labels)
    assert found == expected
