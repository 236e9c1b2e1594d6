"""The BaseTester options table: defaults, stored attributes and argument checks."""

from __future__ import annotations

import inspect

import pytest
import torch
from tester_helpers import SpyCalculator

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.testers import (
    BaseTester,
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
    LabelMapper,
    WithSameParentLabelTester,
)

TESTERS = [
    BaseTester,
    GlobalEmbeddingSpaceTester,
    WithSameParentLabelTester,
    GlobalTwoStreamEmbeddingSpaceTester,
]

SPEC_DEFAULTS = {
    "normalize_embeddings": True,
    "use_trunk_output": False,
    "pca": None,
    "batch_size": 32,
    "dataloader_num_workers": 2,
    "data_device": None,
    "dtype": None,
    "data_and_label_getter": None,
    "label_hierarchy_level": 0,
    "end_of_testing_hook": None,
    "dataset_labels": None,
    "set_min_label_to_zero": False,
    "visualizer": None,
    "visualizer_hook": None,
    "accuracy_calculator": None,
    "embeddings_device": None,
    "progress_bar": True,
    "distributed": False,
    "split_groups": None,
    "single_gallery_shot": False,
    "single_gallery_shot_draws": None,
}


@pytest.mark.parametrize("tester_class", TESTERS)
def test_signature_defaults_are_the_spec_table(tester_class) -> None:
    parameters = inspect.signature(tester_class).parameters
    assert {name: p.default for name, p in parameters.items()} == SPEC_DEFAULTS


@pytest.mark.parametrize("tester_class", TESTERS)
def test_defaults_are_stored(tester_class) -> None:
    spy = SpyCalculator()
    tester = tester_class(accuracy_calculator=spy)
    assert tester.normalize_embeddings is True
    assert tester.use_trunk_output is False
    assert tester.pca is None
    assert tester.batch_size == 32
    assert tester.dataloader_num_workers == 2
    expected_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert tester.data_device == expected_device
    assert tester.embeddings_device == expected_device
    assert tester.dtype is None
    batch = (torch.zeros(1), torch.zeros(1))
    assert tester.data_and_label_getter(batch) is batch  # 2.x's default: c_f.return_input
    assert tester.label_hierarchy_level == 0
    assert tester.end_of_testing_hook is None
    assert tester.dataset_labels is None
    assert tester.set_min_label_to_zero is False
    assert isinstance(tester.label_mapper, LabelMapper)
    assert tester.accuracy_calculator is spy
    assert tester.visualizer is None and tester.visualizer_hook is None
    assert tester.progress_bar is True
    assert tester.all_accuracies == {}


def test_given_options_are_stored() -> None:
    def hook(tester):
        return None

    def getter(batch):
        return batch

    tester = GlobalEmbeddingSpaceTester(
        normalize_embeddings=False,
        use_trunk_output=True,
        pca=3,
        batch_size=7,
        dataloader_num_workers=0,
        data_device="cpu",
        dtype=torch.float16,
        data_and_label_getter=getter,
        label_hierarchy_level=[1, 0],
        end_of_testing_hook=hook,
        dataset_labels=["b", "a"],
        set_min_label_to_zero=True,
        accuracy_calculator=SpyCalculator(),
        embeddings_device=torch.device("cpu"),
        progress_bar=False,
    )
    assert (tester.normalize_embeddings, tester.use_trunk_output, tester.pca) == (False, True, 3)
    assert (tester.batch_size, tester.dataloader_num_workers) == (7, 0)
    assert tester.data_device == torch.device("cpu") == tester.embeddings_device
    assert tester.dtype is torch.float16
    assert tester.data_and_label_getter is getter and tester.end_of_testing_hook is hook
    assert tester.label_hierarchy_level == [1, 0]
    assert tester.label_mapper.map(["a", "b"]).tolist() == [0, 1]
    assert tester.progress_bar is False


@pytest.mark.parametrize(
    ("options", "error", "param"),
    [
        ({"normalize_embeddings": 1}, InvalidTypeError, "normalize_embeddings"),
        ({"use_trunk_output": None}, InvalidTypeError, "use_trunk_output"),
        ({"batch_size": 0}, InvalidArgumentError, "batch_size"),
        ({"batch_size": 2.5}, InvalidTypeError, "batch_size"),
        ({"dataloader_num_workers": -1}, InvalidArgumentError, "dataloader_num_workers"),
        ({"pca": 0}, InvalidArgumentError, "pca"),
        ({"pca": True}, InvalidTypeError, "pca"),
        ({"data_device": "gpu7"}, InvalidArgumentError, "data_device"),
        ({"data_device": 1.5}, InvalidTypeError, "data_device"),
        ({"embeddings_device": "nowhere"}, InvalidArgumentError, "embeddings_device"),
        ({"dtype": torch.int64}, InvalidTypeError, "dtype"),
        ({"dtype": "float16"}, InvalidTypeError, "dtype"),
        ({"data_and_label_getter": 3}, InvalidTypeError, "data_and_label_getter"),
        ({"label_hierarchy_level": -1}, InvalidArgumentError, "label_hierarchy_level"),
        ({"label_hierarchy_level": "some"}, InvalidArgumentError, "label_hierarchy_level"),
        ({"label_hierarchy_level": []}, InvalidArgumentError, "label_hierarchy_level"),
        ({"label_hierarchy_level": [0, 0]}, InvalidArgumentError, "label_hierarchy_level"),
        ({"label_hierarchy_level": 1.0}, InvalidTypeError, "label_hierarchy_level"),
        ({"end_of_testing_hook": "hook"}, InvalidTypeError, "end_of_testing_hook"),
        ({"set_min_label_to_zero": True}, InvalidArgumentError, "dataset_labels"),
        ({"accuracy_calculator": object()}, InvalidTypeError, "accuracy_calculator"),
        ({"visualizer": object(), "visualizer_hook": print}, InvalidTypeError, "visualizer"),
        ({"visualizer_hook": 5}, InvalidTypeError, "visualizer_hook"),
        ({"progress_bar": "no"}, InvalidTypeError, "progress_bar"),
    ],
)
def test_bad_options_name_the_parameter(options, error, param) -> None:
    options.setdefault("accuracy_calculator", SpyCalculator())
    with pytest.raises(error, match=f"'{param}' parameter of"):
        GlobalEmbeddingSpaceTester(**options)


def test_visualizer_without_a_hook_is_an_error() -> None:
    class Visualizer:
        def fit_transform(self, x):
            return x

    with pytest.raises(InvalidArgumentError, match="'visualizer_hook' parameter"):
        GlobalEmbeddingSpaceTester(visualizer=Visualizer(), accuracy_calculator=SpyCalculator())


def test_errors_name_the_tester_class() -> None:
    with pytest.raises(InvalidArgumentError, match="of WithSameParentLabelTester must be"):
        WithSameParentLabelTester(batch_size=0, accuracy_calculator=SpyCalculator())
