"""WithSameParentLabelTester: per-parent scoring, averaging, level restriction."""

from __future__ import annotations

import math

import pytest
import torch
from tester_helpers import SpyCalculator, embed_by_hand, make_model, quiet
from torch.utils.data import TensorDataset

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.testers import WithSameParentLabelTester


class SizeSpy(SpyCalculator):
    """Metrics that identify the subset: its query size and its smallest label."""

    def __init__(self, nan_for_parents=()) -> None:
        super().__init__()
        self.nan_for_sizes = set(nan_for_parents)

    def get_accuracy(self, query, query_labels, reference=None, reference_labels=None, **kwargs):
        super().get_accuracy(query, query_labels, reference, reference_labels, **kwargs)
        size = float(len(query))
        return {
            "precision_at_1": math.nan if size in self.nan_for_sizes else size,
            "NMI": float(query_labels.min()),
        }


def three_levels(parents: list[int], seed: int = 0) -> TensorDataset:
    """Fine labels 0..n-1 under the given parents, one grandparent."""
    generator = torch.Generator().manual_seed(seed)
    parent = torch.tensor(parents)
    fine = torch.arange(len(parents))
    labels = torch.stack([fine, parent, torch.zeros_like(parent)], dim=1)
    return TensorDataset(torch.randn(len(parents), 5, generator=generator), labels)


def run(spy, datasets, splits_to_eval=None, **options) -> dict:
    tester = WithSameParentLabelTester(accuracy_calculator=spy, **quiet(**options))
    return tester.test(datasets, 1, make_model(), splits_to_eval=splits_to_eval)


def test_each_parent_is_scored_on_its_own_subset() -> None:
    spy = SizeSpy()
    split = three_levels([5, 7, 5, 9, 7, 5])
    model = make_model()
    run(spy, {"val": split})
    embeddings = embed_by_hand(model, split.tensors[0])
    parents = split.tensors[1][:, 1]
    assert len(spy.calls) == 3
    for call, parent in zip(spy.calls, [5, 7, 9]):
        rows = parents == parent
        torch.testing.assert_close(call["query"], embeddings[rows])
        torch.testing.assert_close(call["reference"], embeddings[rows])
        assert torch.equal(call["query_labels"], split.tensors[1][rows, 0])
        assert call["ref_includes_query"] is True


def test_metrics_are_the_mean_over_parents() -> None:
    accuracies = run(SizeSpy(), {"val": three_levels([5, 7, 5, 9, 7, 5])})["val"]
    # parents 5, 7, 9 hold 3, 2, 1 queries; their smallest fine labels are 0, 1, 3
    assert accuracies["precision_at_1_level0"] == pytest.approx((3 + 2 + 1) / 3)
    assert accuracies["NMI_level0"] == pytest.approx((0 + 1 + 3) / 3)


def test_cross_split_reference_is_restricted_to_the_same_parent() -> None:
    spy = SizeSpy()
    query, reference = three_levels([1, 2, 1], seed=1), three_levels([2, 2, 1, 3, 1], seed=2)
    run(spy, {"q": query, "r": reference}, splits_to_eval=[("q", ["r", "q"])])
    for call, parent in zip(spy.calls, [1, 2]):
        expected_ref_parents = torch.cat([query.tensors[1][:, 1], reference.tensors[1][:, 1]])
        rows = expected_ref_parents == parent
        assert len(call["reference"]) == int(rows.sum())
        q_rows = int((query.tensors[1][:, 1] == parent).sum())
        assert torch.equal(call["reference"][:q_rows], call["query"])


def test_a_parent_with_only_lone_queries_is_left_out_with_a_warning() -> None:
    spy = SizeSpy(nan_for_parents={1.0})  # the parent with one query gets NaN
    with pytest.warns(UserWarning, match=r"parent labels \[9\].*left out") as record:
        accuracies = run(spy, {"val": three_levels([5, 7, 5, 9, 7, 5])})["val"]
    assert accuracies["precision_at_1_level0"] == pytest.approx((3 + 2) / 2)
    assert accuracies["NMI_level0"] == pytest.approx((0 + 1 + 3) / 3)
    assert record[0].filename == __file__


def test_every_parent_lone_gives_nan() -> None:
    spy = SizeSpy(nan_for_parents={1.0})
    with pytest.warns(UserWarning, match="left out"):
        accuracies = run(spy, {"val": three_levels([5, 7, 9])})["val"]
    assert math.isnan(accuracies["precision_at_1_level0"])


def test_a_parent_without_references_is_left_out_with_a_warning() -> None:
    spy = SizeSpy()
    query, reference = three_levels([1, 2, 1], seed=1), three_levels([1, 1, 3], seed=2)
    with pytest.warns(UserWarning, match=r"parent labels \[2\]"):
        accuracies = run(spy, {"q": query, "r": reference}, splits_to_eval=[("q", ["r"])])["q"]
    assert len(spy.calls) == 1
    assert accuracies["precision_at_1_level0"] == 2.0


def test_all_evaluates_every_level_that_has_a_parent() -> None:
    accuracies = run(SizeSpy(), {"val": three_levels([5, 7, 5])}, label_hierarchy_level="all")
    keys = set(accuracies["val"])
    assert {"precision_at_1_level0", "precision_at_1_level1", "AVERAGE_precision_at_1"} <= keys
    assert "precision_at_1_level2" not in keys
    # level 1: a single parent (the grandparent), holding all 3 queries
    assert accuracies["val"]["precision_at_1_level1"] == 3.0
    assert accuracies["val"]["AVERAGE_precision_at_1"] == pytest.approx((1.5 + 3.0) / 2)


@pytest.mark.parametrize("level", [2, [0, 2]])
def test_the_last_level_has_no_parent_and_is_an_error(level) -> None:
    with pytest.raises(InvalidArgumentError, match=r"split 'val'.*must be at most 1"):
        run(SizeSpy(), {"val": three_levels([5, 7, 5])}, label_hierarchy_level=level)


@pytest.mark.parametrize("level", [0, "all"])
def test_one_label_column_is_an_error(level) -> None:
    split = TensorDataset(torch.randn(4, 5), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(InvalidArgumentError, match="parent label column"):
        run(SizeSpy(), {"val": split}, label_hierarchy_level=level)


def test_per_class_results_cannot_be_averaged_over_parents() -> None:
    spy = SpyCalculator({"precision_at_1": [1.0, 0.0]})
    with pytest.raises(InvalidArgumentError, match="return_per_class"):
        run(spy, {"val": three_levels([5, 7, 5])})


def test_no_parent_with_references_warns_and_scores_nothing() -> None:
    spy = SizeSpy()
    query, reference = three_levels([1, 2], seed=1), three_levels([3, 4], seed=2)
    with pytest.warns(UserWarning, match="nothing to score"):
        accuracies = run(spy, {"q": query, "r": reference}, splits_to_eval=[("q", ["r"])])
    assert accuracies == {"q": {"epoch": 1}}
    assert spy.calls == []


@pytest.mark.parametrize("level", [0, 1])
def test_category_level_is_refused_not_ignored(level):
    from torch.utils.data import TensorDataset

    from pytorch_metric_learning.errors import InvalidArgumentError as Refused
    from pytorch_metric_learning.evaluation import AccuracyCalculator
    from pytorch_metric_learning.testers import WithSameParentLabelTester

    fine = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    labels = torch.stack([fine, fine // 2, fine % 2], dim=1)
    data = torch.eye(4)[fine] + 0.05 * torch.arange(8.0)[:, None]
    tester = WithSameParentLabelTester(
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        dataloader_num_workers=0,
        data_device="cpu",
        progress_bar=False,
    )
    tester.category_level = level  # type: ignore[attr-defined]
    with pytest.raises(Refused, match="'category_level'.*WithSameParentLabelTester"):
        tester.test({"val": TensorDataset(data, labels)}, 1, torch.nn.Identity())
