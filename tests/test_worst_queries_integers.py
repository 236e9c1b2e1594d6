"""find_worst_queries takes its integer arguments as the rest of the library does (the one
integer check of ``_validation``): NumPy integers pass like ``get_accuracy``'s ``k`` does;
bools, floats and tensors are refused naming the argument.

The oracle is the plain list of accepted and refused values written here, checked against
``AccuracyCalculator``'s ``k`` too, so the two stay one rule.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.worst_queries import find_worst_queries

X = torch.tensor([[0.0], [2.0], [3.0], [8.0], [8.5], [1.0]])
Y = torch.tensor([0, 0, 1, 1, 0, 1])
ACCEPTED = [3, np.int64(3), np.int32(3), np.uint8(3), np.int16(3)]
REFUSED = [True, np.bool_(True), 3.0, np.float64(3.0), torch.tensor(3), "3", None]
PARAMS = ("num_queries", "k")


@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("value", ACCEPTED, ids=repr)
def test_integer_scalars_are_accepted(param, value):
    worst = find_worst_queries(X, Y, **{param: value})
    plain = find_worst_queries(X, Y, **{param: 3})
    assert [(w.index, w.value, w.k) for w in worst] == [(w.index, w.value, w.k) for w in plain]
    assert all(type(w.k) is int for w in worst)
    AccuracyCalculator(include=("precision_at_1",), k=value).get_accuracy(X, Y)


@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_other_values_are_refused_naming_the_argument(param, value):
    with pytest.raises((InvalidTypeError, InvalidArgumentError), match=f"'{param}'"):
        find_worst_queries(X, Y, **{param: value})


@pytest.mark.parametrize("param", PARAMS)
@pytest.mark.parametrize("value", [0, -1, np.int64(0)], ids=repr)
def test_non_positive_integers_are_refused(param, value):
    with pytest.raises(InvalidArgumentError, match=f"'{param}'.*positive int"):
        find_worst_queries(X, Y, **{param: value})
