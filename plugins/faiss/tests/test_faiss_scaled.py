"""FaissKNN on embeddings whose squared distances overflow float32."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import BackendRuntimeError
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
