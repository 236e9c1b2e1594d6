"""AccuracyAccumulator against the one-shot AccuracyCalculator: any batch split in one
process, and DistributedSampler shards (padding included) on a spawned 2-rank gloo group."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from _accumulator_workers import spawn
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.distributed import AccuracyAccumulator, DistributedKMeans


def assert_same(got: dict[str, Any], expected: dict[str, Any], rel: float = 0.0) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == pytest.approx(value, rel=rel, abs=0.0), name


def dataset(seed: int, rows: int, dims: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (rows,), generator=generator)
    embeddings = labels.unsqueeze(1).float() + torch.randn(rows, dims, generator=generator)
    return embeddings, labels


@st.composite
def split_data(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    rows = draw(st.integers(2, 40))
    embeddings, labels = dataset(
        draw(st.integers(0, 2**16)), rows, draw(st.integers(1, 4)), draw(st.integers(1, 5))
    )
    cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=6)))
    return embeddings, labels, [0, *cuts, rows]


@given(data=split_data(), k=st.sampled_from([None, "max_bin_count", 3]))
def test_any_batch_split_gives_the_one_shot_metrics(data, k) -> None:
    embeddings, labels, bounds = data
    accumulator = AccuracyAccumulator(k=k)
    for start, stop in zip(bounds, bounds[1:]):  # empty batches included
        accumulator.update(embeddings[start:stop], labels[start:stop])
    expected = AccuracyCalculator(k=k).get_accuracy(embeddings, labels)
    assert_same(accumulator.compute(), expected)
    accumulator.reset()
    assert accumulator.num_rows == 0


@given(data=split_data(), repeats=st.lists(st.integers(0, 39), max_size=5))
def test_rows_repeated_under_the_same_index_count_once(data, repeats) -> None:
    embeddings, labels, bounds = data
    indices = torch.arange(len(labels))
    extra = torch.tensor([i for i in repeats if i < len(labels)], dtype=torch.long)
    accumulator = AccuracyAccumulator(include=("precision_at_1", "r_precision"))
    for start, stop in zip(bounds, bounds[1:]):
        accumulator.update(embeddings[start:stop], labels[start:stop], indices[start:stop])
    accumulator.update(embeddings[extra], labels[extra], extra)  # as a sampler's padding
    expected = AccuracyCalculator(include=("precision_at_1", "r_precision")).get_accuracy(
        embeddings, labels
    )
    assert_same(accumulator.compute(), expected)


def test_bad_batches_are_refused_with_the_argument_named() -> None:
    accumulator = AccuracyAccumulator()
    with pytest.raises(InvalidTypeError, match="'embeddings'"):
        accumulator.update(torch.arange(6).reshape(3, 2), torch.zeros(3))
    with pytest.raises(InvalidArgumentError, match="'labels'.*one label per embedding row"):
        accumulator.update(torch.zeros(3, 2), torch.zeros(2))
    with pytest.raises(InvalidTypeError, match="'indices'.*integer"):
        accumulator.update(torch.zeros(3, 2), torch.zeros(3), torch.zeros(3))
    with pytest.raises(InvalidArgumentError, match="'indices'.*1-D tensor of 3"):
        accumulator.update(torch.zeros(3, 2), torch.zeros(3), torch.arange(4))
    accumulator.update(torch.zeros(3, 2), torch.zeros(3), torch.arange(3))
    with pytest.raises(InvalidArgumentError, match="'embeddings'.*2 columns.*Got '4 columns"):
        accumulator.update(torch.zeros(3, 4), torch.zeros(3), torch.arange(3))
    with pytest.raises(InvalidArgumentError, match="in every batch or in none"):
        accumulator.update(torch.zeros(3, 2), torch.zeros(3))


def test_compute_without_rows_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="no rows"):
        AccuracyAccumulator().compute()


def test_num_samples_is_checked_against_the_rows_received() -> None:
    embeddings, labels = dataset(0, 10, 2, 3)
    accumulator = AccuracyAccumulator(num_samples=11)
    accumulator.update(embeddings, labels)
    with pytest.raises(InvalidArgumentError, match="num_samples=11"):
        accumulator.compute()


@given(
    data=split_data(),
    missing=st.lists(st.integers(0, 39), max_size=3),
    surplus=st.integers(-2, 2),
    repeats=st.lists(st.integers(0, 39), max_size=3),
)
def test_num_samples_with_indices_must_be_the_distinct_indices(
    data, missing, surplus, repeats
) -> None:
    """Both facts given: the distinct indices received (a plain set) must be num_samples;
    repeats (a sampler's padding) do not change that, missing rows or a wrong count do."""
    embeddings, labels, bounds = data
    rows = [i for i in range(len(labels)) if i not in set(missing)]
    rows += [i for i in repeats if i < len(labels)]
    if not rows:
        return
    order = torch.tensor(rows, dtype=torch.long)
    num_samples = len(labels) + surplus
    if num_samples < 1:
        return
    accumulator = AccuracyAccumulator(num_samples=num_samples, include=("precision_at_1",))
    for start in range(0, len(order), 5):
        part = order[start : start + 5]
        accumulator.update(embeddings[part], labels[part], part)
    distinct = len(set(rows))
    if distinct == num_samples:
        kept = torch.tensor(sorted(set(rows), key=rows.index))
        expected = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(
            embeddings[kept], labels[kept]
        )
        assert_same(accumulator.compute(), expected)
    else:
        message = f"name {distinct} distinct dataset rows, but 'num_samples' is {num_samples}"
        with pytest.raises(InvalidArgumentError, match=message):
            accumulator.compute()


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (torch.zeros(3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long)),
        (torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, dtype=torch.long)),
        (torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long)),
        (torch.zeros(3, 2, 1, dtype=torch.long), torch.zeros(3, 2, 2, dtype=torch.long)),
        (torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.int32)),
    ],
)
def test_labels_unlike_the_first_batch_are_refused_at_update(first, then) -> None:
    accumulator = AccuracyAccumulator()
    accumulator.update(torch.zeros(3, 2), first)
    with pytest.raises(InvalidArgumentError, match="'labels'.*as the earlier batches"):
        accumulator.update(torch.zeros(3, 2), then)
    accumulator.reset()  # a new epoch may use other labels
    accumulator.update(torch.zeros(3, 2), then)


def test_update_keeps_references_not_copies() -> None:
    """As documented: update detaches, it does not copy."""
    embeddings, labels = dataset(0, 10, 2, 3)
    accumulator = AccuracyAccumulator(include=("precision_at_1",))
    accumulator.update(embeddings, labels)
    embeddings.zero_()
    assert (
        accumulator.compute()["precision_at_1"]
        == AccuracyCalculator(include=("precision_at_1",)).get_accuracy(torch.zeros(10, 2), labels)[
            "precision_at_1"
        ]
    )


def test_the_per_class_labels_are_those_with_two_rows_or_more() -> None:
    labels = torch.tensor([5, 5, 2, 9, 9, 9, 7])
    accumulator = AccuracyAccumulator(include=("precision_at_1",), return_per_class=True)
    accumulator.update(torch.randn(7, 2), labels)
    values = accumulator.compute()["precision_at_1"]
    assert accumulator.last_class_labels == [5, 9] and len(values) == 2


def test_bad_options_are_refused_at_construction() -> None:
    with pytest.raises(InvalidArgumentError, match="num_samples"):
        AccuracyAccumulator(num_samples=0)
    with pytest.raises(ValueError, match="no_such_metric"):
        AccuracyAccumulator(include=("no_such_metric",))


# ----- under DDP: 2 spawned gloo ranks, a DistributedSampler that pads -----

WORLD = 2
CASES: list[dict[str, Any]] = [
    {"name": "indices_shuffled", "rows": 23, "shuffle": True, "indices": True, "options": {}},
    {"name": "num_samples_shuffled", "rows": 23, "shuffle": True, "indices": False,
     "options": {"num_samples": 23}},
    {"name": "num_samples_in_order", "rows": 31, "shuffle": False, "indices": False,
     "options": {"num_samples": 31, "k": "max_bin_count"}},
    {"name": "even_rows", "rows": 24, "shuffle": True, "indices": False,
     "options": {"num_samples": 24}},
    {"name": "rank0_only", "rows": 13, "shuffle": False, "indices": True, "rank0_only": True,
     "options": {}},
    {"name": "neither", "rows": 23, "shuffle": True, "indices": False, "options": {}},
    {"name": "cut_short", "rows": 23, "shuffle": True, "indices": False, "batches": 2,
     "options": {"num_samples": 23}},
    {"name": "both_cut_short", "rows": 23, "shuffle": True, "indices": True, "batches": 2,
     "options": {"num_samples": 23}},
    {"name": "both_whole", "rows": 23, "shuffle": True, "indices": True,
     "options": {"num_samples": 23}},
    {"name": "rank0_only_label_rows", "rows": 13, "shuffle": False, "indices": True,
     "rank0_only": True, "label_columns": 2, "options": {"exclude": ("NMI", "AMI")}},
]  # fmt: skip


def ddp_cases() -> list[dict[str, Any]]:
    cases = []
    for seed, case in enumerate(CASES):
        embeddings, labels = dataset(seed, case["rows"], 3, 4)
        if case.get("label_columns"):  # a label row per embedding row
            labels = torch.stack([labels, labels % 2], dim=1)
        cases.append({**case, "seed": seed, "batch_size": 4, "embeddings": embeddings,
                      "labels": labels})  # fmt: skip
    return cases


def rank_order_without_padding(case: dict[str, Any]) -> list[int]:
    """The dataset rows as the ranks hold them, in rank order, each row once: read every
    rank's sampler order and keep the first occurrence of each index (a plain loop)."""
    if case.get("rank0_only"):
        return list(range(case["rows"]))
    order: list[int] = []
    for rank in range(WORLD):
        sampler = DistributedSampler(
            range(case["rows"]), WORLD, rank, shuffle=case["shuffle"], seed=case["seed"]
        )
        sampler.set_epoch(1)
        order.extend(sampler)
    kept, seen = [], set()
    for index in order:
        if index not in seen:
            seen.add(index)
            kept.append(index)
    assert sorted(kept) == list(range(case["rows"]))
    return kept


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cases = ddp_cases()
    return cases, spawn(cases, WORLD, str(tmp_path_factory.mktemp("accumulator")))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["indices_shuffled", "num_samples_shuffled",
                                  "num_samples_in_order", "even_rows", "rank0_only",
                                  "both_whole", "rank0_only_label_rows"])  # fmt: skip
def test_every_rank_gets_the_metrics_of_each_row_once(ddp_results, one_rank_group, name) -> None:
    cases, results = ddp_results
    case = next(case for case in cases if case["name"] == name)
    order = torch.tensor(rank_order_without_padding(case))
    options = {k: v for k, v in case["options"].items() if k != "num_samples"}
    # the same k-means algorithm as the ranks (in a group of one), so NMI and AMI compare
    calculator = AccuracyCalculator(kmeans_func=DistributedKMeans(), **options)
    expected = calculator.get_accuracy(case["embeddings"][order], case["labels"][order])
    for rank in range(WORLD):
        assert "value" in results[rank][name], results[rank][name]
        assert_same(results[rank][name]["value"], expected, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "message"), [
    ("neither", "needs 'indices' in update\\(\\) or 'num_samples'"),
    ("cut_short", "neither num_samples=23 nor a DistributedSampler's padded 12 per rank"),
    ("both_cut_short", "name 16 distinct dataset rows, but 'num_samples' is 23"),
])  # fmt: skip
def test_rows_that_cannot_be_told_apart_fail_on_every_rank(ddp_results, name, message) -> None:
    _, results = ddp_results
    for rank in range(WORLD):
        got = results[rank][name]
        assert got.get("error_type") == "InvalidArgumentError", got
        assert re.search(message, got["message"]), got
