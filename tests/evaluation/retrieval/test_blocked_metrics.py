"""The k-NN metrics block by block of queries (``knn_output_budget``) equal the whole path.

The oracle is the same calculator with ``knn_output_budget=None``, which searches every
query at once and computes the metrics from the whole outputs (itself checked against
brute-force loops in the other test files). Embeddings are small integers, so distances
are exact and ties frequent: both paths must order neighbours by (distance, index) alike.
"""

from __future__ import annotations

import json
import logging
import math
import os
import textwrap
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _peak import PEAK_SOURCE, STEADY_THREADS, needs_proc
from _subprocess import run_python
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator, _blocked

KNN_METRICS = (
    *AccuracyCalculator().requires_knn(),  # every built-in k-NN metric
    "recall_at_1",
    "recall_at_4",
    "precision_at_3",
    "mean_average_precision_at_2",
    "ndcg_at_5",
)
LOGGER = "pytorch_metric_learning.evaluation.retrieval.accuracy_calculator"


def same_value(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return abs(a - b) <= 1e-12


def assert_same_results(whole: dict, blocked: dict) -> None:
    assert whole.keys() == blocked.keys()
    for name, value in whole.items():
        if name == "per_query":
            assert_same_per_query(value, blocked[name])
        elif name == "per_category":
            assert value.keys() == blocked[name].keys()
            for category, metrics in value.items():
                assert_same_results(metrics, blocked[name][category])
        else:
            assert same_value(value, blocked[name]), (name, value, blocked[name])


def assert_same_per_query(whole, blocked) -> None:
    assert torch.equal(whole.query_indices, blocked.query_indices)
    assert torch.equal(whole.query_labels, blocked.query_labels)
    assert torch.equal(whole.first_relevant_rank, blocked.first_relevant_rank)
    assert whole.num_retrieved == blocked.num_retrieved
    assert whole.values.keys() == blocked.values.keys()
    for name, values in whole.values.items():
        torch.testing.assert_close(values, blocked.values[name], rtol=0, atol=1e-12)


@st.composite
def evaluations(draw):
    """A call of get_accuracy: its embeddings, labels, options and a tiny budget."""
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    mode = draw(st.sampled_from(["self", "separate", "includes", "roles"]))
    num_query = draw(st.integers(2, 24))
    num_extra = draw(st.integers(1, 24))
    dims = draw(st.integers(1, 3))
    classes = draw(st.integers(1, 5))
    rows = num_query if mode in ("self", "roles") else num_query + num_extra
    x = torch.randint(0, 3, (rows, dims), generator=generator).float()
    labels = torch.randint(0, classes, (rows,), generator=generator)
    call: dict = {}
    if mode == "self":
        call.update(query=x, query_labels=labels)
    elif mode == "separate":
        call.update(
            query=x[:num_query],
            query_labels=labels[:num_query],
            reference=x[num_query:],
            reference_labels=labels[num_query:],
        )
    elif mode == "includes":
        call.update(
            query=x[:num_query],
            query_labels=labels[:num_query],
            reference=x,
            reference_labels=labels,
            ref_includes_query=True,
        )
    else:
        flags = torch.rand(rows, generator=generator)
        is_query, is_reference = flags < 0.7, flags > 0.3
        is_query[0], is_reference[-1] = True, True
        call.update(query=x, query_labels=labels, is_query=is_query, is_reference=is_reference)
    call.update(draw(protocol_options(mode, generator, labels, num_query, rows)))
    if draw(st.booleans()):
        num_queries = int(call["is_query"].sum()) if mode == "roles" else len(call["query"])
        categories = torch.randint(0, 3, (num_queries,), generator=generator)
        call["query_categories"] = categories.tolist()
    call["return_per_query"] = draw(st.booleans())
    options = {
        "k": draw(st.sampled_from([None, "max_bin_count", 1, 3, 7])),
        "averaging": draw(st.sampled_from(["plain", "avg_of_avgs", "return_per_class"])),
        "budget": draw(st.integers(1, 600)),
        # reference bytes searched at a time (the default searches these whole); only a
        # search that copies the reference is chunked: here the L1 distance's (no one-GEMM
        # scorer), exact on these small integers whatever the chunk
        "chunk_bytes": draw(st.sampled_from([_blocked.REFERENCE_CHUNK_BYTES, 1, 24, 100])),
        "manhattan": draw(st.booleans()),
    }
    return call, options


@st.composite
def protocol_options(draw, mode, generator, labels, num_query, rows):
    """The re-identification options (groups, junk, distractors, pairs), or none."""
    found: dict = {}
    if not draw(st.booleans()):
        return found
    if draw(st.booleans()):
        groups = torch.randint(0, 2, (rows,), generator=generator)
        if mode in ("self", "roles"):
            found["query_groups"] = groups
        elif mode == "separate":
            found.update(query_groups=groups[:num_query], reference_groups=groups[num_query:])
        else:
            found.update(query_groups=groups[:num_query], reference_groups=groups)
    label_values = sorted(set(labels.tolist()))
    junk = draw(st.sets(st.sampled_from(label_values), max_size=1))
    distractors = draw(st.sets(st.sampled_from(label_values), max_size=1)) - junk
    found.update(junk_labels=tuple(junk), distractor_labels=tuple(distractors))
    if mode in ("separate", "includes") and draw(st.booleans()):
        num_reference = rows - num_query if mode == "separate" else rows
        count = draw(st.integers(0, 10))
        found["excluded_pairs"] = torch.stack(
            [
                torch.randint(0, num_query, (count,), generator=generator),
                torch.randint(0, num_reference, (count,), generator=generator),
            ],
            dim=1,
        )
    return found


def calculator(options: dict, budget: int | None) -> AccuracyCalculator:
    averaging = options["averaging"]
    if options.get("manhattan"):
        distance = LpDistance(normalize_embeddings=False, p=1)
    else:
        distance = LpDistance(normalize_embeddings=False, power=2)
    return AccuracyCalculator(
        knn_func=CustomKNN(distance),
        include=KNN_METRICS,
        k=options["k"],
        avg_of_avgs=averaging == "avg_of_avgs",
        return_per_class=averaging == "return_per_class",
        knn_output_budget=budget,
    )


@settings(max_examples=120, deadline=None)
@given(evaluations())
def test_blocked_path_equals_whole_path(evaluation):
    call, options = evaluation
    whole_calculator = calculator(options, None)
    whole = whole_calculator.get_accuracy(**call)
    blocked_calculator = calculator(options, options["budget"])
    with mock.patch.object(_blocked, "REFERENCE_CHUNK_BYTES", options["chunk_bytes"]):
        blocked = blocked_calculator.get_accuracy(**call)
    assert_same_results(whole, blocked)
    assert (
        blocked_calculator.last_num_queries_left_out == whole_calculator.last_num_queries_left_out
    )


def clustered(rows: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % classes
    centres = torch.randn(classes, 8, generator=generator)
    return centres[labels] + torch.randn(rows, 8, generator=generator), labels


def test_over_the_budget_runs_in_blocks_and_logs_it(caplog):
    x, labels = clustered(200, 4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        blocked = AccuracyCalculator(exclude=("NMI", "AMI"), knn_output_budget=4096)
        found = blocked.get_accuracy(x, labels)
    assert "k-NN metrics in 34 blocks of 6 queries" in caplog.text  # k = 49, 13 bytes each
    whole = AccuracyCalculator(exclude=("NMI", "AMI"), knn_output_budget=None)
    assert_same_results(whole.get_accuracy(x, labels), found)


def test_within_the_budget_keeps_the_whole_outputs(caplog):
    x, labels = clustered(200, 4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        AccuracyCalculator(exclude=("NMI", "AMI")).get_accuracy(x, labels)
    assert "blocks" not in caplog.text


class WithOwnMetric(AccuracyCalculator):
    def calculate_fraction_relevant(self, knn_labels, query_labels, **kwargs):
        return float((knn_labels == query_labels[:, None]).double().mean())

    def requires_knn(self):
        return [*super().requires_knn(), "fraction_relevant"]


class WithOwnPrecision(AccuracyCalculator):
    def calculate_precision_at_1(self, knn_labels, query_labels, **kwargs):
        return float((knn_labels[:, 0] == query_labels).double().mean())


def exact_function(query, k, reference=None, ref_includes_query=False):
    return CustomKNN(LpDistance(normalize_embeddings=False, power=2))(
        query, k, reference, ref_includes_query
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: WithOwnMetric(knn_output_budget=64), "fraction_relevant"),
        (lambda: WithOwnPrecision(knn_output_budget=64), "precision_at_1"),
        (
            lambda: AccuracyCalculator(knn_func=exact_function, knn_output_budget=64),
            "not CustomKNN",
        ),
    ],
)
def test_whole_outputs_where_blocks_would_not_be_exact(caplog, make, reason):
    x, labels = clustered(60, 3)
    expected = make()
    expected.knn_output_budget = None  # the attribute is the setting
    whole = expected.get_accuracy(x, labels, exclude=("NMI", "AMI"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        found = make().get_accuracy(x, labels, exclude=("NMI", "AMI"))
    assert "computing from the whole outputs" in caplog.text
    assert reason in caplog.text
    assert found == whole


@pytest.mark.parametrize(
    ("budget", "error"),
    [(0, InvalidArgumentError), (-5, InvalidArgumentError), (True, InvalidTypeError),
     (1.5, InvalidTypeError), ("256MiB", InvalidTypeError)],
)  # fmt: skip
def test_budget_must_be_a_positive_int_or_none(budget, error):
    with pytest.raises(error, match="'knn_output_budget' parameter of AccuracyCalculator"):
        AccuracyCalculator(knn_output_budget=budget)
    calculator = AccuracyCalculator(knn_output_budget=1000)
    with pytest.raises(error, match="'knn_output_budget' parameter of AccuracyCalculator"):
        calculator.knn_output_budget = budget  # the attribute is checked as the argument is
    assert calculator.knn_output_budget == 1000


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "all", "10"])
def test_k_set_after_construction_is_checked(k):
    calculator = AccuracyCalculator(k=5)
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="'k' parameter"):
        calculator.k = k
    assert calculator.k == 5
    calculator.k, calculator.knn_output_budget = "max_bin_count", None
    assert "knn_output_budget=None" in repr(calculator)


MEMORY_SCRIPT = PEAK_SOURCE + textwrap.dedent(
    """
    import json, resource, torch
    from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    torch.manual_seed(0)
    rows, classes = 20000, 10
    labels = torch.arange(rows) % classes
    x = torch.randn(classes, 16)[labels] + torch.randn(rows, 16)
    calc = AccuracyCalculator(exclude=("NMI", "AMI"), knn_output_budget=BUDGET)
    calc.get_accuracy(x[:500], labels[:500])  # loads what the first call loads
    before = rss()
    result = calc.get_accuracy(x, labels)
    peak = peak_bytes()
    print(json.dumps({"growth": peak - before, "precision_at_1": result["precision_at_1"]}))
    """
)


@pytest.mark.slow
@needs_proc
def test_peak_memory_follows_the_budget_not_the_outputs():
    """20,000 rows of 10 classes: k = 1,999, whole outputs of 520 MB (20,000 x 1,999 x 13
    bytes); with a 16 MiB budget the call grows by a bounded multiple of it (the search's
    candidates, the sorted outputs and the metrics' temporaries of one block) plus the
    search's distance tiles (64 MiB each, a few at once)."""
    budget = 16 * 2**20
    env = {**os.environ, **STEADY_THREADS, "PML_DISABLE_NUMBA": "1", "PML_DISABLE_PROGRESS": "1"}
    script = MEMORY_SCRIPT.replace("BUDGET", str(budget))
    done = run_python(script, env=env, timeout=600)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    whole_outputs = 20000 * 1999 * 13
    bound = 4 * budget + 3 * 64 * 2**20
    assert found["growth"] <= bound < whole_outputs
    assert 0.0 <= found["precision_at_1"] <= 1.0


def share_an_attribute(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a & b).any(dim=-1)


@pytest.mark.parametrize("reference_given", [False, True])
def test_blocks_with_a_custom_label_comparison(reference_given):
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(0, 3, (40, 2), generator=generator).float()
    attributes = torch.rand(40, 3, generator=generator) < 0.3
    call = {"query": x, "query_labels": attributes, "return_per_query": True}
    if reference_given:
        call.update(query=x[:15], query_labels=attributes[:15])
        call.update(reference=x[15:], reference_labels=attributes[15:])
    found = []
    for budget in (None, 50):
        calc = AccuracyCalculator(
            include=KNN_METRICS, label_comparison_fn=share_an_attribute, knn_output_budget=budget
        )
        found.append(calc.get_accuracy(**call))
    assert_same_results(*found)


class RecordedProgress:
    """Stands in for the progress bar: records its total and the pairs counted."""

    made: list[RecordedProgress] = []

    def __init__(self, total: int, description: str = "") -> None:
        self.total, self.counted = total, 0
        RecordedProgress.made.append(self)

    def update(self, pairs: int) -> None:
        self.counted += pairs

    def __enter__(self) -> RecordedProgress:
        return self

    def __exit__(self, *args) -> None:
        pass


def test_one_progress_bar_counts_every_block():
    x, labels = clustered(90, 3)
    RecordedProgress.made.clear()
    with mock.patch.object(_blocked, "SearchProgress", RecordedProgress):
        AccuracyCalculator(exclude=("NMI", "AMI"), knn_output_budget=2000).get_accuracy(
            x[:50], labels[:50], x, labels, ref_includes_query=True
        )
    assert [(bar.total, bar.counted) for bar in RecordedProgress.made] == [(50 * 90, 50 * 90)]


@pytest.mark.parametrize("p, chunked", [(2, False), (1, True)])
def test_the_reference_is_chunked_only_when_its_search_copies_it(p, chunked):
    """The Euclidean search reads the reference in place: searched whole, however large;
    the L1 search copies it (no one-GEMM scorer): searched in chunks, with equal results."""
    x, labels = clustered(120, 4)
    merges = []
    original = _blocked._merge_first_k

    def merge(found, block, k, distance):
        merges.append(found is not None)
        return original(found, block, k, distance)

    knn = CustomKNN(LpDistance(normalize_embeddings=False, p=p))
    calculator = AccuracyCalculator(exclude=("NMI", "AMI"), knn_func=knn, knn_output_budget=2048)
    whole = AccuracyCalculator(exclude=("NMI", "AMI"), knn_func=knn, knn_output_budget=None)
    with (
        mock.patch.object(_blocked, "REFERENCE_CHUNK_BYTES", 40 * 8 * 4),
        mock.patch.object(_blocked, "_merge_first_k", merge),
    ):
        blocked = calculator.get_accuracy(x, labels)
    assert any(merges) == chunked
    assert_same_results(whole.get_accuracy(x, labels), blocked)
