"""Distances against plain reference computations written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorch_metric_learning.distances import (
    BatchedDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference_matrix(name: str, q: np.ndarray, r: np.ndarray, normalize: bool) -> np.ndarray:
    if normalize:
        q, r = _unit(q), _unit(r)
    out = np.empty((len(q), len(r)))
    for i in range(len(q)):
        for j in range(len(r)):
            if name == "lp":
                out[i, j] = np.sqrt(((q[i] - r[j]) ** 2).sum())
            elif name == "dot":
                out[i, j] = (q[i] * r[j]).sum()
            else:
                out[i, j] = np.var(q[i] - r[j], ddof=1) / np.var(q[i], ddof=1)
    return out


CASES = [
    ("lp", LpDistance, {}),
    ("lp", LpDistance, {"normalize_embeddings": False}),
    ("dot", DotProductSimilarity, {}),
    ("dot", DotProductSimilarity, {"normalize_embeddings": False}),
    ("dot", CosineSimilarity, {}),
    ("snr", SNRDistance, {}),
    ("snr", SNRDistance, {"normalize_embeddings": False}),
]


@pytest.mark.parametrize(("name", "cls", "kwargs"), CASES)
@pytest.mark.parametrize("power", [1, 2])
def test_matrix_and_pairwise_equal_reference(name, cls, kwargs, power) -> None:
    rng = np.random.default_rng(0)
    q, r = rng.normal(size=(7, 5)), rng.normal(size=(9, 5))
    distance = cls(power=power, **kwargs)
    normalize = distance.normalize_embeddings
    expected = _reference_matrix(name, q, r, normalize) ** power
    got = distance(torch.from_numpy(q), torch.from_numpy(r))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9)
    pairs = distance.pairwise(torch.from_numpy(q), torch.from_numpy(r[:7]))
    np.testing.assert_allclose(pairs.numpy(), np.diag(expected[:, :7]), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        distance.pairwise_distance(torch.from_numpy(q), torch.from_numpy(r[:7])).numpy(),
        pairs.numpy(),
    )


def test_squared_euclidean_is_exact_on_small_integers() -> None:
    distance = LpDistance(normalize_embeddings=False, power=2)
    q = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    r = torch.tensor([[0.0, 1.0], [3.0, 0.5], [9.0, 9.0]])
    assert distance(q, r).tolist() == [[1.0, 9.25, 162.0], [10.0, 0.25, 117.0]]


def test_general_p() -> None:
    q, r = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    distance = LpDistance(normalize_embeddings=False, p=1)
    expected = (q[:, None, :] - r[None]).abs().sum(-1)
    torch.testing.assert_close(distance(q, r), expected)


def test_ref_none_compares_with_itself() -> None:
    x = torch.randn(6, 4)
    torch.testing.assert_close(CosineSimilarity()(x), CosineSimilarity()(x, x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "cls", "kwargs"), CASES)
def test_every_float_dtype(name, cls, kwargs, dtype) -> None:
    torch.manual_seed(0)
    q, r = torch.randn(6, 8), torch.randn(5, 8)
    distance = cls(**kwargs)
    got = distance(q.to(dtype), r.to(dtype))
    expected = _reference_matrix(
        name,
        q.to(dtype).double().numpy(),
        r.to(dtype).double().numpy(),
        distance.normalize_embeddings,
    )
    half = dtype in (torch.float16, torch.bfloat16)
    assert got.dtype == (torch.float32 if half and not distance.normalize_embeddings else dtype)
    tolerance = 2e-2 if half else 1e-5
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=tolerance, atol=tolerance)


def test_float16_unnormalized_does_not_overflow() -> None:
    x = torch.full((2, 4), 200.0, dtype=torch.float16)
    y = -x
    got = LpDistance(normalize_embeddings=False, power=2)(x, y)
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all()
    assert got[0, 0].item() == pytest.approx(4 * 400.0**2)


def test_similarities_are_inverted_and_distances_are_not() -> None:
    assert CosineSimilarity().is_inverted and DotProductSimilarity().is_inverted
    assert not LpDistance().is_inverted and not SNRDistance().is_inverted


@pytest.mark.parametrize(
    ("factory", "error"),
    [
        (lambda: LpDistance(is_inverted=True), ValueError),
        (lambda: SNRDistance(is_inverted=True), ValueError),
        (lambda: CosineSimilarity(normalize_embeddings=False), ValueError),
        (lambda: DotProductSimilarity(is_inverted=False), ValueError),
        (lambda: LpDistance(p=0), ValueError),
        (lambda: LpDistance(normalize_embeddings="yes"), TypeError),
    ],
)
def test_invalid_options(factory, error) -> None:
    with pytest.raises(error):
        factory()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((torch.randn(3),), ValueError),
        ((torch.randn(3, 2), torch.randn(3, 4)), ValueError),
        ((torch.ones(3, 2, dtype=torch.long),), TypeError),
        (([[1.0, 2.0]],), TypeError),
    ],
)
def test_invalid_inputs(args, error) -> None:
    with pytest.raises(error):
        LpDistance()(*args)


def test_pairwise_needs_same_shapes() -> None:
    with pytest.raises(ValueError, match="same shape"):
        LpDistance().pairwise(torch.randn(3, 2), torch.randn(4, 2))


def test_batched_distance_covers_every_row_once() -> None:
    q, r = torch.randn(10, 3), torch.randn(4, 3)
    blocks = []
    batched = BatchedDistance(LpDistance(), lambda m, s, e: blocks.append((s, e, m)), 4)
    batched(q, r)
    assert [(s, e) for s, e, _ in blocks] == [(0, 4), (4, 8), (8, 10)]
    torch.testing.assert_close(torch.cat([m for *_, m in blocks]), LpDistance()(q, r))
    assert batched.is_inverted is False
