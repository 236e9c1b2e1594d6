"""FaissKNN on embeddings whose squared distances overflow or underflow float32."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import BackendRuntimeError, InvalidArgumentError
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning_faiss import FaissKNN

pytestmark = pytest.mark.faiss


def test_flat_index_blames_the_overflow_not_an_approximate_index() -> None:
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0)) * 1e20
    with pytest.raises(BackendRuntimeError, match="overflow float32") as caught:
        FaissKNN()(x, 5, x)
    assert "approximate" not in str(caught.value)


def test_scaled_down_embeddings_agree_with_custom_knn() -> None:
    # The advice of the error: scale by a power of two, which changes no neighbour.
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0)) * 1e20
    scaled = x * 2.0**-66
    _, faiss_indices = FaissKNN()(scaled, 5, scaled)
    _, custom_indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 5, x)
    assert torch.equal(faiss_indices, custom_indices)


def test_approximate_index_keeps_its_advice() -> None:
    generator = torch.Generator().manual_seed(0)
    near = torch.randn(15, 2, generator=generator)
    reference = torch.cat([near, near + 100.0])
    with pytest.raises(BackendRuntimeError, match="approximate index"):
        FaissKNN(index="IVF2,Flat", nprobe=1)(reference[:3], 30, reference)


def test_flat_index_refuses_embeddings_whose_distances_underflow() -> None:
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0)) * 1e-25
    with pytest.raises(InvalidArgumentError, match="underflow float32") as caught:
        FaissKNN()(x, 5, x, True)
    assert "'query' and 'reference'" in str(caught.value)
    assert "approximate" not in str(caught.value)
    with pytest.raises(InvalidArgumentError, match="'reference' parameter"):
        FaissKNN(reset_before=False).add(x)  # a persistent index: refused as rows arrive


def test_scaled_up_embeddings_agree_with_custom_knn() -> None:
    # The advice of the error: scale by a power of two, which changes no neighbour.
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0)) * 1e-25
    scaled = x * 2.0**83
    _, faiss_indices = FaissKNN()(scaled, 5, scaled, True)
    _, custom_indices = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(x, 5, x, True)
    assert torch.equal(faiss_indices, custom_indices)


def test_the_limit_is_the_largest_magnitude_of_query_and_reference_together() -> None:
    generator = torch.Generator().manual_seed(0)
    tiny_query = torch.randn(6, 8, generator=generator) * 1e-25
    reference = torch.randn(30, 8, generator=generator)
    _, indices = FaissKNN()(tiny_query, 4, reference)  # distances: the references' norms
    nearest_to_zero = torch.argsort((reference**2).sum(dim=1))[:4]
    assert bool((indices == nearest_to_zero).all())
    small = torch.randn(30, 8, generator=generator)
    small = small / small.abs().max() * 2.0**-59  # just above the limit: searched
    _, indices = FaissKNN()(small, 3, small, True)
    _, expected = CustomKNN(LpDistance(normalize_embeddings=False, power=2))(small, 3, small, True)
    assert torch.equal(indices, expected)
    zeros = torch.zeros(5, 8)  # all at one point: every neighbour truly ties
    distances, _ = FaissKNN()(zeros, 2, zeros, True)
    assert bool((distances == 0).all())
