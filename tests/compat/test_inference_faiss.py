"""2.x ``utils.inference`` code that uses faiss: InferenceModel with FaissKNN, index round
trips through ``knn.index``, and the module-level faiss helpers, against brute force."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from pytorch_metric_learning.errors import BackendRuntimeError, InvalidArgumentError
from pytorch_metric_learning.utils.inference import (
    FaissKMeans,
    FaissKNN,
    InferenceModel,
    add_to_index_and_search,
    convert_to_cpu_index,
    convert_to_gpu_index,
    run_pca,
    try_gpu,
)

faiss = pytest.importorskip("faiss")  # the core-only session collects this file too
pytestmark = pytest.mark.faiss


def _data(seed: int, rows: int, dims: int = 5) -> torch.Tensor:
    return torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))


def _nearest(query: torch.Tensor, gallery: torch.Tensor, k: int) -> list[list[int]]:
    """Indices of the k smallest squared Euclidean distances, by a plain loop."""
    result = []
    for q in query.double().tolist():
        squared = [sum((a - b) ** 2 for a, b in zip(q, g)) for g in gallery.double().tolist()]
        result.append(sorted(range(len(squared)), key=lambda j: squared[j])[:k])
    return result


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True)


def test_the_2x_faiss_gallery_search() -> None:
    trunk = torch.nn.Identity()
    gallery, query = _data(0, 50), _data(1, 6)
    knn_func = FaissKNN(reset_before=False, reset_after=False)  # 2.x's default
    inference_model = InferenceModel(trunk, knn_func=knn_func)
    inference_model.train_knn(gallery)
    distances, indices = inference_model.get_nearest_neighbors(query, k=5)
    assert indices.tolist() == _nearest(_unit(query), _unit(gallery), 5)
    assert knn_func.index.ntotal == 50 and inference_model.reference_embeddings is None
    inference_model.add_to_knn(query)
    assert knn_func.index.ntotal == 56
    assert inference_model.get_nearest_neighbors(query, 1)[1][:, 0].tolist() == list(range(50, 56))


def test_a_2x_index_set_on_knn_func_then_filled_by_add_to_knn() -> None:
    gallery = _data(10, 30)
    inference_model = InferenceModel(
        torch.nn.Identity(), knn_func=FaissKNN(reset_before=False, reset_after=False)
    )
    inference_model.knn_func.index = faiss.IndexFlatL2(5)
    inference_model.add_to_knn(TensorDataset(gallery, torch.zeros(30)))
    distances, indices = inference_model.get_nearest_neighbors([gallery[0]], k=10)
    assert indices[0].tolist() == _nearest(_unit(gallery[:1]), _unit(gallery), 10)[0]
    assert indices[0][0] == 0 and distances.shape == (1, 10)


@pytest.mark.parametrize(
    "spec", ["faiss", {"name": "faiss", "reset_before": False, "reset_after": False}]
)
def test_faiss_by_name_gives_the_same_neighbours_as_custom(spec: object) -> None:
    trunk = torch.nn.Linear(5, 4)
    gallery, query = _data(2, 40), _data(3, 7)
    with_faiss, exact = InferenceModel(trunk, knn_func=spec), InferenceModel(trunk)
    for model in (with_faiss, exact):
        model.train_knn(gallery)
    expected = _nearest(exact.get_embeddings(query), exact.get_embeddings(gallery), 4)
    assert with_faiss.get_nearest_neighbors(query, 4)[1].tolist() == expected
    assert exact.get_nearest_neighbors(query, 4)[1].tolist() == expected


def test_save_and_load_knn_func_round_trip_the_faiss_index(tmp_path: os.PathLike[str]) -> None:
    gallery, query = _data(4, 30), _data(5, 4)
    inference_model = InferenceModel(
        torch.nn.Identity(), knn_func=FaissKNN(reset_before=False, reset_after=False)
    )
    inference_model.train_knn(gallery)
    path = os.path.join(tmp_path, "gallery.index")
    inference_model.save_knn_func(path)
    assert faiss.read_index(path).ntotal == 30  # a plain faiss index file, as in 2.x

    restored = InferenceModel(
        torch.nn.Identity(), knn_func=FaissKNN(reset_before=False, reset_after=False)
    )
    restored.load_knn_func(path)
    assert restored.knn_func.index.ntotal == 30
    assert restored.get_nearest_neighbors(query, 3)[1].tolist() == _nearest(
        _unit(query), _unit(gallery), 3
    )


def test_index_round_trip_through_knn_index(tmp_path: os.PathLike[str]) -> None:
    """2.x code reads ``knn.index``, writes it with faiss, and sets it on another FaissKNN."""
    gallery, query = _data(6, 25), _data(7, 5)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(gallery)
    path = os.path.join(tmp_path, "x.index")
    faiss.write_index(knn.index, path)

    other = FaissKNN(reset_before=False, reset_after=False)
    other.index = faiss.read_index(path)
    distances, indices = other(query, 4)
    assert indices.tolist() == _nearest(query, gallery, 4)
    expected = [
        [float(((q - gallery[j]) ** 2).sum()) for j in row] for q, row in zip(query, indices)
    ]
    np.testing.assert_allclose(distances.numpy(), expected, rtol=1e-4, atol=1e-5)
    other.reset()
    assert other.index is None


def test_a_faiss_l2_backend_on_raw_embeddings_with_cosine_matches_is_warned_about() -> None:
    with pytest.warns(UserWarning, match="#430"):
        InferenceModel(
            torch.nn.Identity(),
            knn_func=FaissKNN(reset_before=False, reset_after=False),
            normalize_embeddings=False,
        )


# --- module-level helpers ---------------------------------------------------------------


def test_add_to_index_and_search_adds_then_searches() -> None:
    index = faiss.IndexFlatL2(2)
    reference = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    distances, indices = add_to_index_and_search(index, torch.tensor([[1.0, 0.0]]), reference, 2)
    assert index.ntotal == 3
    assert indices.tolist() == [[0, 2]] and distances.tolist() == [[1.0, 1.0]]
    # no reference: the index is searched as it is
    distances, indices = add_to_index_and_search(index, torch.tensor([[3.0, 3.0]]), None, 1)
    assert indices.tolist() == [[1]] and distances.tolist() == [[1.0]] and index.ntotal == 3


def test_add_to_index_and_search_casts_integer_tensors_as_2x_did() -> None:
    index = faiss.IndexFlatL2(1)
    _, indices = add_to_index_and_search(index, torch.tensor([[4]]), torch.tensor([[0], [5]]), 1)
    assert indices.tolist() == [[1]]


def test_asking_for_more_neighbours_than_indexed_is_refused() -> None:
    index = faiss.IndexFlatL2(1)
    with pytest.raises(InvalidArgumentError, match="at most the 2 rows"):
        add_to_index_and_search(index, torch.zeros(1, 1), torch.zeros(2, 1), 3)


def test_try_gpu_searches_on_the_cpu_without_gpus() -> None:
    index = faiss.IndexFlatL2(5)
    gallery, query = _data(8, 20), _data(9, 3)
    distances, indices = try_gpu(index, query, gallery, 4, is_cuda=False, gpus=None)
    assert indices.tolist() == _nearest(query, gallery, 4)
    assert index.ntotal == 20 and distances.device.type == "cpu"


def test_convert_to_cpu_index_returns_a_cpu_index_as_is() -> None:
    index = faiss.IndexFlatIP(3)
    assert convert_to_cpu_index(index) is index


@pytest.mark.skipif(hasattr(faiss, "GpuIndex"), reason="this faiss has GPU support")
def test_convert_to_gpu_index_without_gpu_support_is_a_clear_error() -> None:
    with pytest.raises(BackendRuntimeError, match="GPU build of faiss"):
        convert_to_gpu_index(faiss.IndexFlatL2(3), None)


def test_run_pca_projects_onto_the_principal_axis() -> None:
    # points on the line y = 2x: one component carries everything
    x = torch.tensor([[-2.0, -4.0], [-1.0, -2.0], [0.0, 0.0], [1.0, 2.0], [2.0, 4.0]]) + 3.0
    projected = run_pca(x, 1)
    expected = [t * 5**0.5 for t in (-2.0, -1.0, 0.0, 1.0, 2.0)]  # centred, |(1, 2)| = sqrt(5)
    assert projected.shape == (5, 1) and projected.dtype == torch.float32
    sign = 1.0 if float(projected[-1, 0]) > 0 else -1.0
    np.testing.assert_allclose(sign * projected[:, 0].numpy(), expected, atol=1e-4)


def test_run_pca_refuses_more_components_than_columns() -> None:
    with pytest.raises(InvalidArgumentError, match="at most the 2 columns"):
        run_pca(_data(10, 6, dims=2), 3)


def test_faiss_kmeans_with_2x_arguments() -> None:
    x = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.0, 5.1]])
    labels = FaissKMeans(niter=10, seed=1)(x, 2)
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[0] != labels[2]
