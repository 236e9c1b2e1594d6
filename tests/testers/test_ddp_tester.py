"""Testers with distributed=True on spawned gloo groups against the single-process tester.

One spawn per group size runs every case (see ``_ddp_tester_workers``). The split sizes
are not multiples of the group sizes, so every split is padded, and the 2-item split
leaves a rank of the 3-process group without a row of its own.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _ddp_tester_workers import run_case, spawn
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from _gloo import join_gloo_group
from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.distributed import DistributedAccuracyCalculator
from pytorch_metric_learning.testers import (
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
    WithSameParentLabelTester,
)
from pytorch_metric_learning.testers._distributed import shard_indices

DIMS = 6
KNN = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
SIZES = {"train": 23, "val": 17, "test": 11, "tiny": 2}


def labelled_rows(num: int, seed: int, num_classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy points around one centre per class (shared by every split), and the classes."""
    centres = torch.randn(8, DIMS, generator=torch.Generator().manual_seed(99))
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randint(num_classes, (num,), generator=generator)
    return centres[classes] + 0.9 * torch.randn(num, DIMS, generator=generator), classes


def splits(*names: str, levels: int = 1) -> dict[str, tuple[torch.Tensor, ...]]:
    out = {}
    for seed, name in enumerate(names):
        data, classes = labelled_rows(SIZES[name], seed, num_classes=8 if levels > 1 else 4)
        hierarchy = [classes // 2**level for level in range(levels)]
        out[name] = (data, hierarchy[0] if levels == 1 else torch.stack(hierarchy, dim=1))
    return out


def case(name: str, tester: str = "GlobalEmbeddingSpaceTester", **fields: Any) -> dict[str, Any]:
    return {"name": name, "tester": tester, "dims_in": DIMS, "calc": {"include": KNN}, **fields}


def two_stream_splits() -> dict[str, tuple[torch.Tensor, ...]]:
    anchors, classes = labelled_rows(SIZES["val"], 5)
    positives = anchors + 0.5 * torch.randn(
        anchors.shape, generator=torch.Generator().manual_seed(6)
    )
    return {"val": (anchors, positives, classes)}


def same_parent_splits() -> dict[str, tuple[torch.Tensor, ...]]:
    """Fine labels 0-5 in val but 0-3 in train: val's parent 2 has no reference in train.
    Rows sorted by label, so each rank holds other parents than the next one."""
    out = {}
    for seed, (name, classes) in enumerate([("train", 4), ("val", 6)]):
        data, fine = labelled_rows(SIZES[name], seed + 10, num_classes=classes)
        order = torch.argsort(fine, stable=True)
        out[name] = (data[order], torch.stack([fine, fine // 2], dim=1)[order])
    return out


CROSS = [
    ("val", ["train"]),
    ("test", ["train", "test"]),
    ("train", ["val", "train", "test"]),
    ("tiny", ["tiny", "val"]),
]
PLAN = [
    case("defaults", splits=splits("train", "val"), calc={}),
    case("cross", splits=splits("train", "val", "test", "tiny"), splits_to_eval=CROSS),
    case(
        "pca",
        splits=splits("train", "test"),
        calc={},
        options={"pca": 3},
        splits_to_eval=[("test", ["test", "train"]), ("train", ["train"])],
        embed_split="train",
    ),
    case(
        "levels",
        splits=splits("train", "val", levels=3),
        options={"label_hierarchy_level": "all"},
        splits_to_eval=[("val", ["train", "val"])],
    ),
    case("level_list", splits=splits("val", levels=3), options={"label_hierarchy_level": [2, 0]}),
    case(
        "same_parent",
        tester="WithSameParentLabelTester",
        splits=same_parent_splits(),
        splits_to_eval=[("val", ["train"]), ("train", ["train"])],
    ),
    case(
        "two_stream",
        tester="GlobalTwoStreamEmbeddingSpaceTester",
        splits=two_stream_splits(),
        embed_split="val",
    ),
    case("visualize", splits=splits("val", "tiny"), options={"visualize": True}),
    case("hook_container", splits=splits("val", "train"), hook_container=True),
    case("length_mismatch", splits=splits("val"), length_on_rank={1: 10}),
    case("model_failure", splits=splits("val"), fail_on_rank=1),
    case("after_failure", splits=splits("test")),
]
CASES = {c["name"]: c for c in PLAN}
SUCCEEDING = [name for name in CASES if name not in ("length_mismatch", "model_failure")]


@pytest.fixture(scope="module")
def single_process() -> dict[str, dict[str, Any]]:
    """Every succeeding case run by the single-process tester (in a group of one process,
    which the single-process oracle's DistributedKMeans needs)."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        join_gloo_group(directory, 0, 1, 10)
        try:
            return {name: run_case(CASES[name]) for name in SUCCEEDING}
        finally:
            dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def ranks(request, tmp_path_factory) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, spawn(PLAN, world, str(tmp_path_factory.mktemp(f"ddp_tester{world}")))


def value(results: dict[str, Any], name: str) -> dict[str, Any]:
    got = results[name]
    assert "value" in got, got.get("traceback")
    return got["value"]


def assert_same_accuracies(got: dict[str, Any], expected: dict[str, Any], rel=1e-12) -> None:
    assert list(got) == list(expected)
    for split, metrics in expected.items():
        assert list(got[split]) == list(metrics), split
        for key, number in metrics.items():
            other = got[split][key]
            same = (math.isnan(other) and math.isnan(number)) or other == pytest.approx(
                number, rel=rel, abs=rel * 1e-3
            )
            assert same, (split, key, other, number)


def own_counts(num: int, world: int) -> list[int]:
    """Rows each rank keeps: DistributedSampler's share without its padding."""
    return [len(range(rank, num, world)) for rank in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("name", SUCCEEDING)
def test_every_rank_gets_the_single_process_accuracies(ranks, single_process, name) -> None:
    world, results = ranks
    expected = single_process[name]["accuracies"]
    for rank in range(world):
        got = value(results[rank], name)
        assert_same_accuracies(got["accuracies"], expected)
        assert_same_accuracies(got["accuracies"], value(results[0], name)["accuracies"], rel=0)


@pytest.mark.slow
def test_metrics_are_not_trivial(single_process) -> None:
    metrics = single_process["cross"]["accuracies"]["val"]
    assert 0.2 < metrics["precision_at_1_level0"] < 0.95
    assert 0.2 < single_process["defaults"]["accuracies"]["val"]["NMI_level0"] < 0.95
    pca = single_process["pca"]["accuracies"]["test"]
    assert set(pca) >= {"precision_at_1_level0_pca3", "AMI_level0_pca3"}
    levels = single_process["levels"]["accuracies"]["val"]
    assert "AVERAGE_r_precision" in levels and "r_precision_level2" in levels


@pytest.mark.slow
@pytest.mark.parametrize("name", SUCCEEDING)
def test_the_ranks_rows_are_each_item_once_in_dataset_order(ranks, single_process, name):
    """Hook on every rank, once; the ranks' rows (padding dropped) concatenate to the
    single-process embeddings; every rank ran the same number of forward passes."""
    world, results = ranks
    expected = single_process[name]["hook"]
    assert len(expected) == 1
    per_rank = [value(results[rank], name) for rank in range(world)]
    for got in per_rank:
        assert len(got["hook"]) == 1
        assert_same_accuracies(got["hook"][0]["accuracies"], got["accuracies"], rel=0)
    assert len({got["forward_calls"] for got in per_rank}) == 1
    for split, (embeddings, labels) in expected[0]["rows"].items():
        shards = [got["hook"][0]["rows"][split] for got in per_rank]
        assert [len(shard_labels) for _, shard_labels in shards] == own_counts(len(labels), world)
        streams = len(embeddings) // len(labels)
        for stream in range(streams):
            dims = embeddings.shape[1]
            rows = torch.cat([e.reshape(streams, len(lab), dims)[stream] for e, lab in shards])
            torch.testing.assert_close(rows, embeddings.reshape(streams, len(labels), dims)[stream])
        assert torch.equal(torch.cat([shard_labels for _, shard_labels in shards]), labels)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pca", "two_stream"])
def test_get_all_embeddings_returns_the_whole_split_on_every_rank(ranks, single_process, name):
    world, results = ranks
    expected, expected_labels = single_process[name]["all_embeddings"]
    for rank in range(world):
        embeddings, labels = value(results[rank], name)["all_embeddings"]
        assert torch.equal(labels, expected_labels)
        # PCA components are defined up to sign
        signs = torch.sign((embeddings * expected).sum(0))
        torch.testing.assert_close(embeddings * signs, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_visualizer_runs_on_rank_0_with_every_query(ranks, single_process) -> None:
    world, results = ranks
    expected = single_process["visualize"]["visualized"]
    got = value(results[0], "visualize")["visualized"]
    assert [entry[2:] for entry in got] == [entry[2:] for entry in expected]
    for (points, labels, *_), (expected_points, expected_labels, *_) in zip(got, expected):
        np.testing.assert_allclose(points, expected_points, rtol=1e-6)
        np.testing.assert_array_equal(labels, expected_labels)
    for rank in range(1, world):
        assert value(results[rank], "visualize")["visualized"] == []


@pytest.mark.slow
def test_logging_preset_hooks_record_on_rank_0_only(ranks, single_process) -> None:
    world, results = ranks
    expected = single_process["hook_container"]
    assert expected["recorded_groups"] == ["accuracies_train", "accuracies_val"]
    assert value(results[0], "hook_container")["recorded_groups"] == expected["recorded_groups"]
    for rank in range(world):
        got = value(results[rank], "hook_container")
        assert got["best"] == expected["best"]
        if rank:
            assert got["recorded_groups"] == []


@pytest.mark.slow
def test_a_split_of_another_length_on_one_rank_fails_every_rank(ranks) -> None:
    world, results = ranks
    for rank in range(world):
        got = results[rank]["length_mismatch"]
        assert "InvalidArgumentError" in got["error_mro"], got
        assert "same length on every rank" in got["message"]
        assert "[17, 10" in got["message"]


@pytest.mark.slow
def test_a_rank_whose_model_fails_fails_every_rank(ranks) -> None:
    world, results = ranks
    assert results[1]["model_failure"]["message"] == "injected failure in the model"
    for rank in set(range(world)) - {1}:
        got = results[rank]["model_failure"]
        assert "DistributedEvaluationError" in got["error_mro"], got
        assert "injected failure in the model" in got["message"]


@given(st.integers(1, 60), st.integers(1, 7))
def test_shards_are_distributed_sampler_shares_made_contiguous(num: int, world: int) -> None:
    """Each rank embeds as many items as DistributedSampler(shuffle=False) gives it and
    keeps as many as the sampler gives it before padding; the kept items, in rank order,
    are the dataset once in order."""
    kept = []
    for rank in range(world):
        sampler = DistributedSampler(range(num), num_replicas=world, rank=rank, shuffle=False)
        indices, own = shard_indices(num, rank, world)
        assert len(indices) == len(sampler)
        assert own == own_counts(num, world)[rank]
        assert all(0 <= index < num for index in indices)
        kept += indices[:own]
    assert kept == list(range(num))


@pytest.mark.parametrize(
    "tester_class",
    [GlobalEmbeddingSpaceTester, WithSameParentLabelTester, GlobalTwoStreamEmbeddingSpaceTester],
)
def test_distributed_defaults_to_a_distributed_calculator(tester_class) -> None:
    tester = tester_class(distributed=True)
    assert isinstance(tester.accuracy_calculator, DistributedAccuracyCalculator)
    assert tester_class().distributed is False


def test_the_calculator_must_match_the_mode() -> None:
    with pytest.raises(InvalidArgumentError, match="DistributedAccuracyCalculator when distrib"):
        GlobalEmbeddingSpaceTester(distributed=True, accuracy_calculator=AccuracyCalculator())
    with pytest.raises(InvalidArgumentError, match="unless distributed=True"):
        GlobalEmbeddingSpaceTester(accuracy_calculator=DistributedAccuracyCalculator())
    with pytest.raises(TypeError, match="'distributed'"):
        GlobalEmbeddingSpaceTester(distributed=1)


def test_distributed_without_a_process_group_says_so() -> None:
    data, labels = labelled_rows(5, 0)
    tester = GlobalEmbeddingSpaceTester(
        distributed=True, dataloader_num_workers=0, data_device="cpu", progress_bar=False
    )
    with pytest.raises(RuntimeError, match="init_process_group"):
        tester.test({"val": torch.utils.data.TensorDataset(data, labels)}, 1, torch.nn.Identity())
