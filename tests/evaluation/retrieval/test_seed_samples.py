"""The seed's code samples, verbatim."""

from __future__ import annotations


def test_custom_knn_sample() -> None:
    import torch

    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.evaluation import CustomKNN

    query = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    reference = torch.tensor([[0.0, 1.0], [3.0, 0.5], [9.0, 9.0]])
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    distances, indices = knn(query, 1, reference)
    assert indices.tolist() == [[0], [1]]
    assert distances.tolist() == [[1.0], [0.25]]


def test_logging_sample() -> None:
    import logging

    # The sample changes process-wide logging: it is put back afterwards for the tests that
    # run after it in this worker (test_registry.py checks the library is silent by default).
    library = logging.getLogger("pytorch_metric_learning")
    level, handlers = library.level, list(logging.root.handlers)
    try:
        logging.basicConfig()
        logging.getLogger("pytorch_metric_learning").setLevel(logging.INFO)
    finally:
        library.setLevel(level)
        logging.root.handlers[:] = handlers
