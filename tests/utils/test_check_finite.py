"""check_finite: every NaN or infinity is caught, huge finite values are not refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning._validation import check_finite
from pytorch_metric_learning.errors import InvalidArgumentError


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(1, 300),
    bad=st.lists(st.sampled_from([float("nan"), float("inf"), -float("inf")]), max_size=3),
    scale=st.sampled_from([1.0, 1e30, 3e38]),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_refuses_exactly_the_tensors_with_a_non_finite_value(size, bad, scale, dtype, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    values = (torch.rand(size, generator=generator, dtype=torch.float64) * scale).to(dtype)
    values = torch.where(torch.isfinite(values), values, torch.finfo(dtype).max)
    positions = torch.randint(0, size, (len(bad),), generator=generator)
    for position, value in zip(positions.tolist(), bad):
        values[position] = value
    if bool(torch.isfinite(values).all()):  # overflowing sums must not be taken for inf
        assert check_finite(values, "query", "Owner") is values
    else:
        with pytest.raises(InvalidArgumentError, match="'query' parameter of Owner"):
            check_finite(values, "query", "Owner")
