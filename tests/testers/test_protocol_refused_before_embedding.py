"""A tester whose protocol options its calculator refuses says so before any embedding is
computed: when it is built, or (its calculator replaced since) at the start of ``test()``.

Every refused combination of the calculator that a tester's options can reach is listed
here by hand: a custom ``label_comparison_fn`` with ``split_groups`` (the re-ID groups),
``single_gallery_shot`` (with or without ``single_gallery_shot_draws``) or both, and
``distributed`` with ``split_groups`` or ``single_gallery_shot``. (Junk and distractor
labels, excluded pairs and the roles of one set are no tester option.) A model whose
forward raises proves that the refusal came first.
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

GROUPS = {"val": torch.tensor([0, 1, 0, 1, 0, 1])}
# the tester's options -> the argument names the refusal must name
WITH_CUSTOM_COMPARISON = [
    ({"split_groups": GROUPS}, ["split_groups"]),
    ({"single_gallery_shot": True}, ["single_gallery_shot"]),
    (
        {"single_gallery_shot": True, "single_gallery_shot_draws": 3},
        ["single_gallery_shot", "single_gallery_shot_draws"],
    ),
    (
        {"split_groups": GROUPS, "single_gallery_shot": True},
        ["split_groups", "single_gallery_shot"],
    ),
]
WITH_DISTRIBUTED = [
    ({"split_groups": GROUPS}, ["split_groups", "distributed"]),
    ({"single_gallery_shot": True}, ["single_gallery_shot", "distributed"]),
]


class ForwardRan(Exception):
    """Raised by the model: reaching it means an embedding was being computed."""


def _raising_model(_: torch.Tensor) -> torch.Tensor:
    raise ForwardRan("the model's forward ran")


def _custom_calculator() -> AccuracyCalculator:
    return AccuracyCalculator(include=("precision_at_1",), label_comparison_fn=lambda a, b: a == b)


def _datasets(tester_class: type) -> dict[str, torch.utils.data.Dataset]:
    data = torch.randn(6, 3)
    if tester_class is GlobalTwoStreamEmbeddingSpaceTester:
        items = (data, data + 0.1, torch.arange(6) % 2)
    elif tester_class is WithSameParentLabelTester:
        items = (data, torch.stack([torch.arange(6) % 2, torch.zeros(6, dtype=torch.long)], 1))
    else:
        items = (data, torch.arange(6) % 2)
    return {"val": torch.utils.data.TensorDataset(*items)}


def _assert_names(error: BaseException, names: list[str]) -> None:
    message = str(error)
    for name in names:
        assert f"'{name}'" in message or name in message, (name, message)


@pytest.mark.parametrize("tester_class", TESTERS)
@pytest.mark.parametrize(("options", "names"), WITH_CUSTOM_COMPARISON)
def test_a_custom_comparison_is_refused_when_the_tester_is_built(tester_class, options, names):
    with pytest.raises(InvalidArgumentError) as caught:
        tester_class(accuracy_calculator=_custom_calculator(), **options)
    assert isinstance(caught.value, NotImplementedError)  # as the calculator raises it
    _assert_names(caught.value, [*names, "label_comparison_fn"])
    assert tester_class.__name__ in str(caught.value)
    assert "need plain label equality" in str(caught.value)


@pytest.mark.parametrize("tester_class", TESTERS)
@pytest.mark.parametrize(("options", "names"), WITH_CUSTOM_COMPARISON)
def test_a_calculator_swapped_in_later_is_refused_before_any_embedding(
    tester_class, options, names
):
    tester = tester_class(
        data_device="cpu", dataloader_num_workers=0, progress_bar=False, **options
    )
    tester.accuracy_calculator = _custom_calculator()
    with pytest.raises(InvalidArgumentError) as caught:
        tester.test(_datasets(tester_class), 0, _raising_model)
    _assert_names(caught.value, [*names, "label_comparison_fn"])


@pytest.mark.parametrize("tester_class", TESTERS)
@pytest.mark.parametrize(("options", "names"), WITH_CUSTOM_COMPARISON)
def test_a_comparison_set_on_the_calculator_later_is_refused_before_any_embedding(
    tester_class, options, names
):
    calculator = AccuracyCalculator(include=("precision_at_1",))
    tester = tester_class(
        data_device="cpu",
        dataloader_num_workers=0,
        progress_bar=False,
        accuracy_calculator=calculator,
        **options,
    )
    calculator.label_comparison_fn = lambda a, b: a == b
    with pytest.raises(InvalidArgumentError) as caught:
        tester.test(_datasets(tester_class), 0, _raising_model)
    _assert_names(caught.value, [*names, "label_comparison_fn"])


@pytest.mark.parametrize("tester_class", TESTERS)
@pytest.mark.parametrize(("options", "names"), WITH_DISTRIBUTED)
def test_distributed_protocol_options_are_refused_when_built(tester_class, options, names):
    with pytest.raises(InvalidArgumentError) as caught:
        tester_class(distributed=True, **options)
    _assert_names(caught.value, names)


@pytest.mark.parametrize("tester_class", TESTERS)
def test_the_model_does_run_without_a_refused_combination(tester_class):
    """The raising model is reached when nothing is refused (the tests above can fail)."""
    tester = tester_class(
        data_device="cpu",
        dataloader_num_workers=0,
        progress_bar=False,
        accuracy_calculator=_custom_calculator(),
    )
    with pytest.raises(ForwardRan):
        tester.test(_datasets(tester_class), 0, _raising_model)
