"""Gradients through every distance are finite where a distance is exactly or nearly 0.

The oracle is a central finite difference of the forward values (away from 0), and, at 0,
only finiteness: the derivative of ``||x - y||`` is undefined there and 0 is used.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.distances import (
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)

POWERS = [0.5, 1, 1.5, 2, 3]


def _distances() -> list[tuple[str, object]]:
    made = []
    for power, normalize in itertools.product(POWERS, (True, False)):
        for p in (1, 2, 3):
            made.append((f"lp p={p}", LpDistance(p=p, power=power, normalize_embeddings=normalize)))
        made.append(("snr", SNRDistance(power=power, normalize_embeddings=normalize)))
        made.append(("dot", DotProductSimilarity(power=power, normalize_embeddings=normalize)))
    for power in (1, 2):
        made.append(("cos", CosineSimilarity(power=power)))
    return made


DISTANCES = _distances()


def _batch_with_duplicates(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(5, 4, generator=generator, dtype=torch.float64) + 0.5
    x[3] = x[1]  # a duplicate row: distance 0 off the diagonal too
    return x


def _masked_loss(mat: torch.Tensor) -> torch.Tensor:
    # the usual loss over d(x): the diagonal (and NaN-prone entries) masked out
    mask = ~torch.eye(len(mat), dtype=torch.bool)
    mask[1, 3] = mask[3, 1] = False
    return torch.where(mask, mat, torch.zeros_like(mat)).sum()


@pytest.mark.parametrize(("name", "distance"), DISTANCES, ids=[n for n, _ in DISTANCES])
def test_matrix_gradient_is_finite_at_zero_distances(name, distance) -> None:
    for loss_of in (_masked_loss, torch.sum):
        x = _batch_with_duplicates(0).requires_grad_(True)
        mat = distance(x)
        if not torch.isfinite(mat).all():
            continue  # e.g. a fractional power of a negative similarity: NaN in 2.x too
        loss_of(mat).backward()
        assert torch.isfinite(x.grad).all(), name


@pytest.mark.parametrize(("name", "distance"), DISTANCES, ids=[n for n, _ in DISTANCES])
def test_pairwise_gradient_is_finite_at_zero_distances(name, distance) -> None:
    x = _batch_with_duplicates(1).requires_grad_(True)
    values = distance.pairwise(x, x.flip(0) * 0 + x)  # every pair identical
    if not torch.isfinite(values).all():
        return
    (values * 0).sum().backward()  # a fully masked loss must not produce NaN
    assert torch.isfinite(x.grad).all(), name


def _finite_difference(fn, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    grad = torch.zeros_like(x)
    for index in itertools.product(*(range(s) for s in x.shape)):
        up, down = x.clone(), x.clone()
        up[index] += eps
        down[index] -= eps
        grad[index] = (fn(up) - fn(down)) / (2 * eps)
    return grad


@settings(max_examples=25, deadline=None)
@given(
    gap=st.floats(min_value=1e-3, max_value=1.0),
    power=st.sampled_from(POWERS),
    p=st.sampled_from([1, 2, 3]),
    normalize=st.booleans(),
)
def test_near_zero_gradient_matches_finite_differences(gap, power, p, normalize) -> None:
    distance = LpDistance(p=p, power=power, normalize_embeddings=normalize)
    base = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    other = base + torch.tensor([[gap, -gap / 2, gap / 3]], dtype=torch.float64)

    def value(q: torch.Tensor) -> torch.Tensor:
        return distance(q, other)[0, 0]

    x = base.clone().requires_grad_(True)
    value(x).backward()
    expected = _finite_difference(lambda q: value(q).detach(), base)
    torch.testing.assert_close(x.grad, expected, rtol=1e-4, atol=1e-6)


def test_zero_safe_forward_values_are_unchanged() -> None:
    x = _batch_with_duplicates(2)
    for _, distance in DISTANCES:
        plain = distance(x)
        with_grad = distance(x.clone().requires_grad_(True)).detach()
        torch.testing.assert_close(with_grad, plain, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "distance",
    [LpDistance(), LpDistance(power=0.5), LpDistance(p=1, power=1.5), SNRDistance(power=0.5)],
    ids=repr,
)
def test_gradcheck_near_zero(distance) -> None:
    base = _batch_with_duplicates(3)[:1]
    near = torch.cat([base, base + 1e-3 * torch.tensor([[1.0, -2.0, 0.5, 3.0]])])
    near = near.to(torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q: distance(q)[0, 1], (near,))


@pytest.mark.parametrize("power", [1, 0.5, 2])
def test_large_matrices_use_the_matrix_product_path_with_finite_gradients(power) -> None:
    # rows * cols * dims above lp_distance._DIRECT_LIMIT: |q|^2 + |r|^2 - 2 q.r, clamped
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(1100, 1, generator=generator, dtype=torch.float64)
    x[7] = x[3]
    x.requires_grad_(True)
    mat = LpDistance(normalize_embeddings=False, power=power)(x)
    assert mat.shape == (1100, 1100)
    mask = ~torch.eye(1100, dtype=torch.bool)
    mask[3, 7] = mask[7, 3] = False
    torch.where(mask, mat, torch.zeros_like(mat)).sum().backward()
    assert torch.isfinite(x.grad).all()
