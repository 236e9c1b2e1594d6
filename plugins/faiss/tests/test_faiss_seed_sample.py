"""The seed's FaissKNN persistent-index sample, verbatim."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.faiss


def test_persistent_index_sample() -> None:
    import os
    import tempfile

    import torch

    from pytorch_metric_learning.evaluation import FaissKNN

    reference, more_reference, query = (
        torch.randn(50, 8),
        torch.randn(20, 8),
        torch.randn(5, 8),
    )
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(reference)  # new index containing reference
    knn.add(more_reference)  # append rows; indices continue at 50
    distances, indices = knn(query, 10)
    assert indices.shape == (5, 10)

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "reference.index")
        knn.save(path)
        restored = FaissKNN(reset_before=False, reset_after=False)
        restored.load(path)
        assert torch.equal(restored(query, 10)[1], indices)
