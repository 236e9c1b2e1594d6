"""2.x-style use of utils.accuracy_calculator, checked against values worked out by hand.

Written the way 2.x's own tests and user code are: module-level helpers fed hand-made
``knn_labels`` and ``label_counts`` (plain lists, as 2.x tests wrote them), and
``_get_accuracy(calc.get_function_dict(), **kwargs)``.
"""

from __future__ import annotations

import logging
import math
import unittest

import numpy as np
import pytest
import torch

from pytorch_metric_learning.utils import accuracy_calculator
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

# Five queries with distinct labels, five neighbours each.
KNN_LABELS = torch.tensor(
    [[0, 1, 1, 2, 2], [1, 0, 1, 1, 3], [4, 4, 4, 4, 2], [3, 1, 3, 1, 3], [0, 0, 4, 2, 2]]
)
QUERY_LABELS = torch.tensor([0, 1, 2, 3, 4])
LABEL_COUNTS = ([0, 1, 2, 3, 4], [2, 5, 4, 5, 3])
# By hand, per query (R = the label's count, reference separate from the query):
P_AT_1 = [1, 1, 0, 1, 0]
P_AT_3 = [1 / 3, 2 / 3, 0, 2 / 3, 1 / 3]
R_PRECISION = [1 / 2, 3 / 5, 0, 3 / 5, 1 / 3]
R_PRECISION_SELF = [1, 3 / 4, 0, 2 / 4, 0]  # R = count - 1 when the query is in the reference
MAP_AT_R = [1 / 2, (1 + 2 / 3 + 3 / 4) / 5, 0, (1 + 2 / 3 + 3 / 5) / 5, (1 / 3) / 3]
MAP = [1 / 2, (1 + 2 / 3 + 3 / 4) / 5, (1 / 5) / 4, (1 + 2 / 3 + 3 / 5) / 5, (1 / 3) / 3]
MRR = [1, 1, 1 / 5, 1, 1 / 3]


def mean(values):
    return sum(values) / len(values)


class TestModuleLevelHelpers(unittest.TestCase):
    def test_precision_at_k(self):
        gt = QUERY_LABELS[:, None]
        eq = accuracy_calculator.EQUALITY
        acc1 = accuracy_calculator.precision_at_k(KNN_LABELS, gt, 1, False, False, eq)
        acc3 = accuracy_calculator.precision_at_k(KNN_LABELS, gt, 3, False, False, eq)
        self.assertIsInstance(acc1, float)
        self.assertAlmostEqual(acc1, mean(P_AT_1))
        self.assertAlmostEqual(acc3, mean(P_AT_3))

    def test_r_precision(self):
        for ref_includes_query, want in [(False, R_PRECISION), (True, R_PRECISION_SELF)]:
            acc = accuracy_calculator.r_precision(
                KNN_LABELS,
                QUERY_LABELS[:, None],
                ref_includes_query,
                LABEL_COUNTS,
                False,
                False,
                accuracy_calculator.EQUALITY,
            )
            self.assertAlmostEqual(acc, mean(want))

    def test_mean_average_precision_and_at_r(self):
        args = (KNN_LABELS, QUERY_LABELS[:, None], False, LABEL_COUNTS, False, False, torch.eq)
        at_r = accuracy_calculator.mean_average_precision(*args, at_r=True)
        at_k = accuracy_calculator.mean_average_precision(*args)
        self.assertAlmostEqual(at_r, mean(MAP_AT_R))
        self.assertAlmostEqual(at_k, mean(MAP))

    def test_mean_reciprocal_rank(self):
        acc = accuracy_calculator.mean_reciprocal_rank(
            KNN_LABELS, QUERY_LABELS[:, None], False, False, torch.eq
        )
        self.assertAlmostEqual(acc, mean(MRR))

    def test_return_per_class_and_avg_of_avgs(self):
        knn_labels = torch.tensor([[0, 1], [1, 0], [1, 1]])
        gt = torch.tensor([0, 0, 1])[:, None]  # per-sample precision@1: 1, 0, 1
        per_class = accuracy_calculator.precision_at_k(knn_labels, gt, 1, False, True, torch.eq)
        avg_of_avgs = accuracy_calculator.precision_at_k(knn_labels, gt, 1, True, False, torch.eq)
        plain = accuracy_calculator.precision_at_k(knn_labels, gt, 1, False, False, torch.eq)
        self.assertEqual(per_class, [0.5, 1.0])
        self.assertAlmostEqual(avg_of_avgs, 0.75)
        self.assertAlmostEqual(plain, 2 / 3)

    def test_relevance_mask(self):
        mask, count = accuracy_calculator.get_relevance_mask(
            (5, 5), QUERY_LABELS[:, None], True, LABEL_COUNTS
        )
        self.assertEqual(count.tolist(), [1, 4, 3, 4, 2])
        self.assertEqual(mask.sum(dim=1).tolist(), [1, 4, 3, 4, 2])
        self.assertTrue(bool(mask[1, :4].all()) and not bool(mask[1, 4]))

    def test_label_match_counts_and_lone_queries(self):
        query, reference = torch.tensor([0, 0, 1, 5]), torch.tensor([0, 1, 1, 1, 2])
        unique, counts = accuracy_calculator.get_label_match_counts(query, reference, torch.eq)
        self.assertEqual((unique.tolist(), counts.tolist()), ([0, 1, 5], [1, 3, 0]))
        lone, mask = accuracy_calculator.get_lone_query_labels(
            query, (unique, counts), False, torch.eq
        )
        self.assertEqual((lone.tolist(), mask.tolist()), ([5], [True, True, True, False]))
        itself = torch.tensor([0, 1, 1, 2])  # the query is the reference: 0 and 2 are alone
        counts = accuracy_calculator.get_label_match_counts(itself, itself, torch.eq)
        lone, mask = accuracy_calculator.get_lone_query_labels(itself, counts, True, torch.eq)
        self.assertEqual((lone.tolist(), mask.tolist()), ([0, 2], [False, True, True, False]))

    def test_not_lone_labels_and_nan_accuracy(self):
        mask = torch.tensor([True, False, True, False, False])
        knn, query = accuracy_calculator.try_getting_not_lone_labels(KNN_LABELS, QUERY_LABELS, mask)
        self.assertEqual(query.tolist(), [0, 2])
        self.assertEqual(knn.tolist(), [KNN_LABELS[0].tolist(), KNN_LABELS[2].tolist()])
        none = accuracy_calculator.try_getting_not_lone_labels(
            KNN_LABELS, QUERY_LABELS, torch.zeros(5, dtype=torch.bool)
        )
        self.assertEqual(none, (None, None))
        self.assertTrue(math.isnan(accuracy_calculator.nan_accuracy([1, 2], False)))
        per_class = accuracy_calculator.nan_accuracy(torch.tensor([1, 2, 3]), True)
        self.assertEqual(len(per_class), 3)
        self.assertTrue(all(math.isnan(v) for v in per_class))

    def test_unique_labels_of_rows(self):
        labels = torch.tensor([[1, 2], [0, 9], [1, 2]])
        got = accuracy_calculator.get_unique_labels(labels)
        self.assertEqual(got.tolist(), [[0, 9], [1, 2]])


# 2-D labels (coarse, fine): a match shares the coarse label but not the fine one,
# the comparison 2.x's documentation shows.
def coarse_same_fine_different(x, y):
    return (x[..., 0] == y[..., 0]) & (x[..., 1] != y[..., 1])


QUERY_2D = torch.tensor([[0, 0], [0, 1], [1, 0]])
REFERENCE_2D = torch.tensor([[0, 1], [0, 0], [0, 2], [1, 0], [1, 1]])
KNN_2D = torch.tensor(
    [
        [[0, 1], [1, 0], [0, 2]],  # relevant: yes, no, yes
        [[0, 1], [0, 0], [1, 1]],  # no, yes, no
        [[1, 0], [1, 1], [0, 0]],  # no, yes, no
    ]
)


class TestTwoDimensionalLabels(unittest.TestCase):
    def test_match_counts_with_a_custom_comparison(self):
        unique, counts = accuracy_calculator.get_label_match_counts(
            QUERY_2D, REFERENCE_2D, coarse_same_fine_different
        )
        self.assertEqual(unique.tolist(), [[0, 0], [0, 1], [1, 0]])
        self.assertEqual(counts.tolist(), [2, 2, 1])

    def test_metrics_with_a_custom_comparison(self):
        label_counts = (QUERY_2D, torch.tensor([2, 2, 1]))
        calc = AccuracyCalculator(
            include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
            label_comparison_fn=coarse_same_fine_different,
        )
        kwargs = {
            "query_labels": QUERY_2D,
            "knn_labels": KNN_2D,
            "label_counts": label_counts,
            "not_lone_query_mask": torch.ones(3, dtype=torch.bool),
            "ref_includes_query": False,
        }
        acc = calc._get_accuracy(calc.get_function_dict(), **kwargs)
        self.assertAlmostEqual(acc["precision_at_1"], 1 / 3)
        self.assertAlmostEqual(acc["r_precision"], (1 / 2 + 1 / 2 + 0) / 3)
        self.assertAlmostEqual(acc["mean_average_precision_at_r"], (1 / 2 + 1 / 4 + 0) / 3)
        p_at_3 = accuracy_calculator.precision_at_k(
            KNN_2D, QUERY_2D[:, None], 3, False, False, coarse_same_fine_different
        )
        self.assertAlmostEqual(p_at_3, (2 / 3 + 1 / 3 + 1 / 3) / 3)


class TestAccuracyCalculatorAs2x(unittest.TestCase):
    def knn_kwargs(self, not_lone_query_mask=None):
        if not_lone_query_mask is None:
            not_lone_query_mask = torch.ones(5, dtype=torch.bool)
        return {
            "query_labels": QUERY_LABELS,
            "label_counts": LABEL_COUNTS,
            "knn_labels": KNN_LABELS,
            "not_lone_query_mask": not_lone_query_mask,
            "ref_includes_query": False,
        }

    def test_get_function_dict_is_the_construction_selection(self):
        calc = AccuracyCalculator(exclude=("NMI", "AMI"))
        function_dict = calc.get_function_dict()
        self.assertEqual(
            set(function_dict), {"precision_at_1", "r_precision", "mean_average_precision_at_r"}
        )
        self.assertEqual(set(calc.get_function_dict(exclude=("r_precision",))), {
            "precision_at_1", "mean_average_precision_at_r"
        })  # fmt: skip
        self.assertEqual(list(calc.get_function_dict(include=("r_precision",))), ["r_precision"])
        acc = calc._get_accuracy(function_dict, **self.knn_kwargs())
        self.assertAlmostEqual(acc["precision_at_1"], mean(P_AT_1))
        self.assertAlmostEqual(acc["r_precision"], mean(R_PRECISION))
        self.assertAlmostEqual(acc["mean_average_precision_at_r"], mean(MAP_AT_R))

    def test_on_request_metrics_and_avg_of_avgs_through_get_accuracy_kwargs(self):
        calc = AccuracyCalculator(
            include=("mean_average_precision", "mean_reciprocal_rank"), avg_of_avgs=True
        )
        acc = calc._get_accuracy(calc.get_function_dict(), **self.knn_kwargs())
        # every query has its own label, so the average of averages is the plain mean
        self.assertAlmostEqual(acc["mean_average_precision"], mean(MAP))
        self.assertAlmostEqual(acc["mean_reciprocal_rank"], mean(MRR))
        self.assertEqual(calc.description(), "avg_of_avgs")
        self.assertEqual(AccuracyCalculator().description(), "")

    def test_lone_queries_are_left_out(self):
        calc = AccuracyCalculator(include=("precision_at_1", "r_precision"))
        mask = torch.tensor([True, True, False, True, False])
        acc = calc._get_accuracy(calc.get_function_dict(), **self.knn_kwargs(mask))
        self.assertAlmostEqual(acc["precision_at_1"], 1.0)
        self.assertAlmostEqual(acc["r_precision"], (1 / 2 + 3 / 5 + 3 / 5) / 3)
        all_lone = self.knn_kwargs(torch.zeros(5, dtype=torch.bool))
        acc = calc._get_accuracy(calc.get_function_dict(), **all_lone)
        self.assertTrue(math.isnan(acc["precision_at_1"]))

    def test_get_curr_metrics_and_check_primary_metrics(self):
        calc = AccuracyCalculator(include=("precision_at_1", "NMI"))
        self.assertEqual(sorted(calc.get_curr_metrics()), ["NMI", "precision_at_1"])
        with self.assertRaises(TypeError):
            calc.check_primary_metrics(include="precision_at_1")
        with self.assertRaises(ValueError):
            calc.check_primary_metrics(exclude=("precision_at_0",))
        calc.check_primary_metrics(include=("r_precision",), exclude=("AMI",))

    def test_determine_k(self):
        bin_counts = torch.tensor([3, 6, 2])
        self.assertEqual(AccuracyCalculator(k="max_bin_count").determine_k(bin_counts, 20, True), 5)
        self.assertEqual(
            AccuracyCalculator(k="max_bin_count").determine_k(bin_counts, 20, False), 6
        )
        self.assertEqual(AccuracyCalculator(k=None).determine_k(bin_counts, 20, True), 19)
        self.assertEqual(AccuracyCalculator(k=None).determine_k(bin_counts, 20, False), 20)
        with self.assertLogs(level="WARNING") as logs:
            self.assertEqual(AccuracyCalculator(k=4).determine_k(bin_counts, 20, False), 4)
        self.assertIn("max_bin_count", logs.output[0])

    def test_k_below_max_bin_count_is_logged_as_in_2x(self):
        embeddings = torch.arange(40).reshape(20, 2)  # integer embeddings, as 2.x tests built
        labels = torch.arange(20) // 10  # R = 9 for every query
        calc = AccuracyCalculator(include=("r_precision",), k=5)
        with self.assertLogs(level="WARNING") as logs:
            calc.get_accuracy(embeddings, labels)
        self.assertIn("k=5", logs.output[0])
        with self.assertLogs(c_f.LOGGER, level="WARNING") as logs:  # the 2.x logger name
            calc.get_accuracy(embeddings, labels)
        self.assertIn("max bin count", logs.output[0])

    def test_k_at_or_above_max_bin_count_is_logged_at_info_as_in_2x(self):
        embeddings = torch.arange(40, dtype=torch.float).reshape(20, 2)
        labels = torch.arange(20) // 10  # R = 9 for every query
        for k in (2000, "max_bin_count", 9):
            calc = AccuracyCalculator(include=("r_precision", "precision_at_1"), k=k)
            with self.assertLogs(level="INFO") as logs:
                calc.get_accuracy(embeddings, labels)
            self.assertTrue(any("k=" in line and "INFO" in line for line in logs.output), logs)


POINTS = [0, 1, 3, 10, 11, 20, 22]  # on a line; no two gaps are equal
LABELS = [0, 0, 1, 1, 1, 2, 2]
# Nearest other point: 1, 0, 1, 11, 10, 22, 20 -> matches 1, 1, 0, 1, 1, 1, 1.
P_AT_1_POINTS = 6 / 7
P_AT_1_POINTS_AVG_OF_AVGS = (1 + 2 / 3 + 1) / 3


@pytest.mark.parametrize(
    "embeddings",
    [
        torch.tensor(POINTS)[:, None],
        torch.tensor(POINTS, dtype=torch.int32)[:, None],
        np.array(POINTS)[:, None],
        torch.tensor(POINTS, dtype=torch.float64)[:, None],
    ],
    ids=["torch.int64", "torch.int32", "numpy.int64", "torch.float64"],
)
def test_integer_embeddings_are_scored_like_floats(embeddings):
    labels = torch.tensor(LABELS)
    acc = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(embeddings, labels)
    assert acc["precision_at_1"] == pytest.approx(P_AT_1_POINTS)
    calc = AccuracyCalculator(include=("precision_at_1",), avg_of_avgs=True)
    assert calc.get_accuracy(embeddings, labels)["precision_at_1"] == pytest.approx(
        P_AT_1_POINTS_AVG_OF_AVGS
    )


def test_overridden_determine_k_chooses_the_search_k():
    calls = []

    def spy_knn(query, k, reference, ref_includes_query):
        calls.append(k)
        distances = torch.cdist(query, reference)
        if ref_includes_query:
            distances.fill_diagonal_(float("inf"))
        return distances.topk(k, largest=False)

    class FixedK(AccuracyCalculator):
        def determine_k(self, bin_counts, num_reference_embeddings, ref_includes_query):
            return 3

    embeddings = torch.tensor(POINTS, dtype=torch.float32)[:, None]
    FixedK(include=("precision_at_1",), knn_func=spy_knn).get_accuracy(
        embeddings, torch.tensor(LABELS)
    )
    assert calls == [3]


def test_messages_reach_the_2x_logger_once(caplog):
    """Records of the package's module loggers reach c_f.LOGGER's handlers, not root twice."""
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Collect(level=logging.WARNING)
    c_f.set_logger_name("my_app.pml")
    logging.getLogger("my_app").addHandler(handler)
    try:
        assert c_f.LOGGER_NAME == "my_app.pml" and c_f.LOGGER.name == "my_app.pml"
        calc = AccuracyCalculator(include=("r_precision",), k=1)
        with caplog.at_level(logging.WARNING):
            calc.get_accuracy(torch.arange(20).reshape(10, 2), torch.arange(10) // 5)
    finally:
        logging.getLogger("my_app").removeHandler(handler)
        c_f.set_logger_name("PML")
    assert len(seen) == 1 and "k=1" in seen[0]
    assert len(caplog.records) == 1
    assert c_f.LOGGER_NAME == "PML"
