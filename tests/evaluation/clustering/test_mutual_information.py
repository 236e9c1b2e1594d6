"""NMI and AMI in PyTorch against scikit-learn (the oracle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import (
    adjusted_mutual_info_score,
    mutual_info_score,
    normalized_mutual_info_score,
)

from pytorch_metric_learning.evaluation.clustering import mutual_information as mi


def check(labels_true, labels_pred):
    a, b = np.asarray(labels_true), np.asarray(labels_pred)
    ta, tb = torch.as_tensor(a), torch.as_tensor(b)
    assert mi.normalized_mutual_info(ta, tb) == pytest.approx(
        normalized_mutual_info_score(a, b), abs=1e-9
    )
    assert mi.adjusted_mutual_info(ta, tb) == pytest.approx(
        adjusted_mutual_info_score(a, b), abs=1e-9
    )
    assert mi.mutual_info(ta, tb) == pytest.approx(mutual_info_score(a, b), abs=1e-9)


@given(
    n=st.integers(1, 300),
    num_true=st.integers(1, 40),
    num_pred=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_random_label_pairs(n, num_true, num_pred, seed):
    rng = np.random.default_rng(seed)
    check(rng.integers(0, num_true, n), rng.integers(0, num_pred, n))


@pytest.mark.parametrize(
    ("n", "num_true", "num_pred"),
    [(2000, 1000, 1000), (3000, 2000, 60), (5000, 100, 100), (1000, 1000, 3)],
)
def test_many_clusters(n, num_true, num_pred):
    rng = np.random.default_rng(n)
    check(rng.integers(0, num_true, n), rng.integers(0, num_pred, n))


@pytest.mark.parametrize("chunk", [1, 37, 1000])
def test_expected_mutual_info_summed_in_chunks(monkeypatch, chunk):
    # The terms are summed a few pairs of marginal counts at a time; any cut gives the same.
    monkeypatch.setattr(mi, "_EMI_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    check(rng.integers(0, 30, 1500), rng.integers(0, 45, 1500))


def test_nearly_perfect_clustering_with_many_clusters():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(500), 20)
    clusters = labels.copy()
    flip = rng.choice(len(labels), 300, replace=False)
    clusters[flip] = rng.integers(0, 500, 300)
    check(labels, clusters)


@pytest.mark.parametrize(
    ("labels_true", "labels_pred"),
    [
        ([0, 0, 0], [0, 0, 0]),  # one cluster each: perfect
        ([0, 0, 0], [0, 1, 2]),  # one true label
        ([0, 1, 2], [5, 5, 5]),  # one cluster
        ([7], [3]),  # one sample
        ([0, 1], [0, 1]),
        ([0, 0, 1, 1], [1, 1, 0, 0]),
        ([0, 1, 2, 3], [0, 1, 2, 3]),  # every sample its own label
        ([0, 1, 2, 3], [0, 0, 1, 1]),
    ],
)
def test_edge_cases(labels_true, labels_pred):
    check(labels_true, labels_pred)


def test_empty_labelings_match_perfectly():
    empty = torch.zeros(0, dtype=torch.long)
    assert mi.normalized_mutual_info(empty, empty) == normalized_mutual_info_score([], [])
    assert mi.adjusted_mutual_info(empty, empty) == adjusted_mutual_info_score([], [])


def test_label_values_and_dtypes_do_not_matter():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 5, 100), rng.integers(0, 7, 100)
    check(a * 1000 + 2**40, b.astype(np.float64) / 3)


def test_entropy_and_expected_mutual_info():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    counts = np.array([2, 1, 3]) / 6
    assert mi.entropy(labels) == pytest.approx(-(counts * np.log(counts)).sum())
    assert mi.entropy(torch.tensor([4, 4])) == 0.0
    # E[MI] with all singletons is the MI itself: every labeling is a permutation.
    ids = torch.arange(6)
    assert mi.expected_mutual_info(ids, ids) == pytest.approx(np.log(6))
    assert mi.expected_mutual_info(ids, torch.zeros(6, dtype=torch.long)) == 0.0


def test_invalid_inputs():
    with pytest.raises(ValueError):
        mi.normalized_mutual_info(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError):
        mi.adjusted_mutual_info(torch.zeros(3), torch.zeros(4))
    with pytest.raises(TypeError):
        mi.normalized_mutual_info([0, 1], torch.zeros(2))


def test_docstring_examples():
    import doctest

    from pytorch_metric_learning.evaluation.clustering import mutual_information as module

    assert doctest.testmod(module, raise_on_error=False).failed == 0
