"""FaissKNN declares its order: an inner-product index returns similarities, largest first."""

from __future__ import annotations

import pytest
import torch

from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    CustomKNN,
    check_knn_output,
    knn_is_inverted,
)

pytestmark = pytest.mark.faiss
faiss = pytest.importorskip("faiss")
FaissKNN = pytest.importorskip("pytorch_metric_learning_faiss").FaissKNN


def unit_rows(seed: int, rows: int, dims: int = 6) -> torch.Tensor:
    x = torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(x, dim=1)


def test_the_index_built_last_decides_is_inverted() -> None:
    query, reference = unit_rows(0, 10), unit_rows(1, 40)
    inner = FaissKNN(index_init_fn=faiss.IndexFlatIP)
    output = inner(query, 4, reference)
    assert inner.is_inverted is True and knn_is_inverted(inner) is True
    check_knn_output(output, query, 4, reference, backend=inner)
    l2 = FaissKNN()
    output = l2(query, 4, reference)
    assert l2.is_inverted is False
    check_knn_output(output, query, 4, reference, backend=l2)


def test_calculator_scores_an_inner_product_index_like_exact_cosine_search() -> None:
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 4, (120,), generator=generator)
    x = torch.nn.functional.normalize(
        3 * torch.randn(4, 6, generator=generator)[labels]
        + torch.randn(120, 6, generator=generator),
        dim=1,
    )
    metrics = ("precision_at_1", "r_precision", "mean_average_precision_at_r")
    faiss_ip = AccuracyCalculator(
        include=metrics, knn_func=FaissKNN(index_init_fn=faiss.IndexFlatIP)
    )
    exact = AccuracyCalculator(include=metrics, knn_func=CustomKNN(CosineSimilarity()))
    found, expected = faiss_ip.get_accuracy(x, labels), exact.get_accuracy(x, labels)
    assert found == pytest.approx(expected, abs=1e-6)


def test_a_live_index_set_by_hand_decides_is_inverted() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.index = faiss.IndexFlatIP(6)
    reference = unit_rows(3, 30)
    knn.add(reference)
    assert knn.is_inverted is True and knn_is_inverted(knn) is True
    query = unit_rows(4, 5)
    check_knn_output(knn(query, 3), query, 3, reference, backend=knn)
