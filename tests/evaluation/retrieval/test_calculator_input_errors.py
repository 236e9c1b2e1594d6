"""AccuracyCalculator's construction and input errors name the argument at fault (issue 12)."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning import errors
from pytorch_metric_learning.evaluation import AccuracyCalculator


@pytest.mark.parametrize("device", ["nonsense", "cuda:x", "meta"])
def test_an_unusable_device_is_refused_at_construction(device) -> None:
    with pytest.raises(ValueError, match=r"'device' parameter of AccuracyCalculator") as info:
        AccuracyCalculator(device=device)
    assert isinstance(info.value, errors.PMLError) and repr(device) in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", torch.device("cuda:0"), 0])
def test_cuda_without_cuda_is_refused_at_construction(device) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="'device'.*CUDA is not available"):
        AccuracyCalculator(device=device)


@pytest.mark.parametrize("device", [1.5, True, ["cpu"]])
def test_a_device_of_the_wrong_type_is_a_type_error(device) -> None:
    with pytest.raises(TypeError, match="'device'"):
        AccuracyCalculator(device=device)


def test_cpu_device_is_accepted_and_used() -> None:
    calc = AccuracyCalculator(include=("precision_at_1",), device="cpu")
    x = torch.tensor([[0.0], [0.1], [5.0], [5.1]])
    assert calc.get_accuracy(x, torch.tensor([0, 0, 1, 1])) == {"precision_at_1": 1.0}


@pytest.mark.parametrize("reference_given", [False, True])
def test_nan_labels_are_named_as_such(reference_given) -> None:
    x = torch.randn(6, 3)
    labels = torch.tensor([0.0, 1.0, float("nan"), 1.0, 0.0, 1.0])
    calc = AccuracyCalculator(include=("precision_at_1",))
    with pytest.raises(ValueError, match="'query_labels'.*1 NaN labels") as info:
        if reference_given:
            calc.get_accuracy(x, labels, x.clone(), labels.nan_to_num(2.0))
        else:
            calc.get_accuracy(x, labels)
    assert "ref_includes_query" not in str(info.value)
    with pytest.raises(ValueError, match="'reference_labels'.*NaN"):
        calc.get_accuracy(x, labels.nan_to_num(2.0), x.clone(), labels)


@pytest.mark.parametrize("include", [("precision_at_1",), ("NMI", "AMI"), ()])
def test_zero_query_rows_name_the_query(include) -> None:
    with pytest.raises(ValueError, match="'query'.*at least one row.*shape \\(0, 3\\)") as info:
        AccuracyCalculator(include=include).get_accuracy(torch.zeros(0, 3), torch.zeros(0))
    assert "KMeans" not in str(info.value)


def test_zero_reference_rows_name_the_reference() -> None:
    x, labels = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="'reference'.*at least one row"):
        AccuracyCalculator(include=("precision_at_1",)).get_accuracy(
            x, labels, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)
        )
