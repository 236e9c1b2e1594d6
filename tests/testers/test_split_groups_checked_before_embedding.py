"""``split_groups`` that cannot serve ``splits_to_eval`` (a split evaluated, as query or as
reference, without group ids; ids of another length than the split's dataset) are refused
before the first forward pass, for every tester class, not after every split was embedded.

The oracle: a model that counts its calls must have been called 0 times when refused (and
some times when the groups fit, so the count can fail), and the message names
``split_groups`` and the split.
"""

from __future__ import annotations

import pytest
import torch
from tester_helpers import TESTERS

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.testers import (
    GlobalTwoStreamEmbeddingSpaceTester,
    WithSameParentLabelTester,
)

SIZES = {"train": 8, "val": 6}


class CountingModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def _datasets(tester_class: type) -> dict[str, torch.utils.data.Dataset]:
    found = {}
    for name, size in SIZES.items():
        data = torch.randn(size, 3, generator=torch.Generator().manual_seed(size))
        labels = torch.arange(size) % 2
        if tester_class is GlobalTwoStreamEmbeddingSpaceTester:
            items = (data, data + 0.1, labels)
        elif tester_class is WithSameParentLabelTester:
            items = (data, torch.stack([labels, torch.zeros(size, dtype=torch.long)], 1))
        else:
            items = (data, labels)
        found[name] = torch.utils.data.TensorDataset(*items)
    return found


def _plan(tester_class: type):
    if tester_class is GlobalTwoStreamEmbeddingSpaceTester:
        return [("val", ["val"]), ("train", ["train"])]  # each split against itself only
    return [("val", ["val", "train"])]


def _groups(size: int) -> torch.Tensor:
    return torch.arange(size) % 3


# what is wrong -> (split_groups, the split the message must name)
BAD = {
    "query split missing": ({"train": _groups(8)}, "val"),
    "reference split missing": ({"val": _groups(6)}, "train"),
    "query ids too few": ({"val": _groups(5), "train": _groups(8)}, "val"),
    "query ids too many": ({"val": _groups(7), "train": _groups(8)}, "val"),
    "reference ids too few": ({"val": _groups(6), "train": _groups(2)}, "train"),
    "no groups for anything": ({"test": _groups(6)}, "val"),
}


def _tester(tester_class: type, split_groups):
    return tester_class(
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1",)),
        data_device="cpu",
        dataloader_num_workers=0,
        progress_bar=False,
        split_groups=split_groups,
    )


@pytest.mark.parametrize("tester_class", TESTERS)
@pytest.mark.parametrize("kind", list(BAD))
def test_unusable_split_groups_are_refused_before_any_forward_pass(tester_class, kind):
    split_groups, named = BAD[kind]
    model = CountingModel()
    tester = _tester(tester_class, split_groups)
    with pytest.raises(InvalidArgumentError) as caught:
        tester.test(_datasets(tester_class), 0, model, splits_to_eval=_plan(tester_class))
    assert model.calls == 0
    message = str(caught.value)
    assert "'split_groups'" in message and repr(named) in message


@pytest.mark.parametrize("tester_class", TESTERS)
def test_fitting_split_groups_run_the_model(tester_class):
    model = CountingModel()
    tester = _tester(tester_class, {"val": _groups(6), "train": _groups(8)})
    found = tester.test(_datasets(tester_class), 0, model, splits_to_eval=_plan(tester_class))
    assert model.calls > 0
    assert "val" in found
