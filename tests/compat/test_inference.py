"""2.x ``utils.inference`` code, written as a 2.x user writes it, without faiss.

Every expected value is computed here: embeddings by hand from the trunk's weights,
neighbours by a plain loop over the gallery, matches by comparing cosines with the threshold.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import Dataset, TensorDataset

from pytorch_metric_learning.distances import (
    BatchedDistance,
    CosineSimilarity,
    LpDistance,
)
from pytorch_metric_learning.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    UnknownBackendError,
)
from pytorch_metric_learning.utils import inference
from pytorch_metric_learning.utils.inference import (
    CustomKNN,
    InferenceModel,
    MatchFinder,
    get_topk,
    mask_reshape_knn_idx,
    return_results,
)


def _trunk(seed: int = 0, dims_in: int = 6, dims_out: int = 4) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(dims_in, dims_out)


def _data(seed: int, rows: int, dims: int = 6) -> torch.Tensor:
    return torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))


def _embed_by_hand(trunk: torch.nn.Linear, x: torch.Tensor, normalize: bool = True) -> list:
    rows = []
    weight, bias = trunk.weight.detach().double(), trunk.bias.detach().double()
    for row in x.double():
        out = [
            float(sum(weight[i, j] * row[j] for j in range(len(row))) + bias[i])
            for i in range(len(bias))
        ]
        norm = math.sqrt(sum(v * v for v in out)) if normalize else 1.0
        rows.append([v / norm for v in out])
    return rows


def _brute_force(query: list, gallery: list, k: int, key) -> tuple[list, list]:
    """The k gallery rows with the smallest key(q, g), ties by index, and those keys."""
    indices, values = [], []
    for q in query:
        scored = sorted(range(len(gallery)), key=lambda j: (key(q, gallery[j]), j))[:k]
        indices.append(scored)
        values.append([key(q, gallery[j]) for j in scored])
    return indices, values


def _embedded_brute_force(
    trunk: torch.nn.Linear, query: torch.Tensor, gallery: torch.Tensor, k: int, key
) -> tuple[list, list]:
    """:func:`_brute_force` over the query and gallery rows embedded by hand (normalized)."""
    return _brute_force(_embed_by_hand(trunk, query), _embed_by_hand(trunk, gallery), k, key)


def _squared_euclidean(a: list, b: list) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b))


def _cosine(a: list, b: list) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# --- gallery search ---------------------------------------------------------------------


def test_gallery_search_with_the_default_custom_backend() -> None:
    trunk = _trunk()
    gallery, query = _data(1, 40), _data(2, 7)
    inference_model = InferenceModel(trunk)
    inference_model.train_knn(gallery)
    distances, indices = inference_model.get_nearest_neighbors(query, k=5)

    expected_indices, expected_distances = _embedded_brute_force(
        trunk, query, gallery, 5, _squared_euclidean
    )
    assert indices.tolist() == expected_indices
    torch.testing.assert_close(
        distances.double(),
        torch.tensor(expected_distances, dtype=torch.float64),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("spec", ["custom", {"name": "custom", "distance": "euclidean"}])
def test_gallery_search_with_a_backend_named_by_spec(spec: object) -> None:
    trunk = _trunk(3)
    gallery, query = _data(4, 30), _data(5, 6)
    inference_model = InferenceModel(trunk, knn_func=spec)
    inference_model.train_knn(gallery)
    _, indices = inference_model.get_nearest_neighbors(query, k=4)
    expected, _ = _embedded_brute_force(trunk, query, gallery, 4, _squared_euclidean)
    assert indices.tolist() == expected


def test_cosine_backend_returns_similarities_largest_first() -> None:
    trunk = _trunk(6)
    gallery, query = _data(7, 25), _data(8, 5)
    inference_model = InferenceModel(trunk, knn_func={"name": "custom", "distance": "cosine"})
    inference_model.train_knn(gallery)
    similarities, indices = inference_model.get_nearest_neighbors(query, k=3)
    expected, values = _embedded_brute_force(trunk, query, gallery, 3, lambda a, b: -_cosine(a, b))
    assert indices.tolist() == expected
    torch.testing.assert_close(
        similarities.double(), -torch.tensor(values, dtype=torch.float64), atol=1e-5, rtol=1e-5
    )


def test_add_to_knn_appends_and_numbers_after_the_gallery() -> None:
    trunk = _trunk(9)
    first, second = _data(10, 12), _data(11, 5)
    inference_model = InferenceModel(trunk)
    inference_model.train_knn(first)
    inference_model.add_to_knn(second)
    _, indices = inference_model.get_nearest_neighbors(second, k=1)
    assert indices[:, 0].tolist() == list(range(12, 17))
    inference_model.train_knn(second)  # train replaces the gallery
    assert len(inference_model.reference_embeddings) == 5


def test_inputs_may_be_a_dataset_or_a_list_of_tensors() -> None:
    trunk = _trunk(12)
    gallery, query = _data(13, 20), _data(14, 4)
    from_tensor = InferenceModel(trunk)
    from_tensor.train_knn(gallery, batch_size=7)
    from_dataset = InferenceModel(trunk)
    from_dataset.train_knn(TensorDataset(gallery, torch.arange(20)), batch_size=6)
    from_list = InferenceModel(trunk)
    from_list.train_knn(list(gallery), batch_size=64)
    expected = from_tensor.get_nearest_neighbors(query, 3)[1]
    assert torch.equal(from_dataset.get_nearest_neighbors(query, 3)[1], expected)
    assert torch.equal(from_list.get_nearest_neighbors(list(query), 3)[1], expected)
    torch.testing.assert_close(from_dataset.reference_embeddings, from_tensor.reference_embeddings)


def test_a_2x_style_knn_function_gets_the_gallery() -> None:
    calls = []

    def my_knn(query, k, reference, embeddings_come_from_same_source=False):  # 2.x names
        calls.append((len(query), k, len(reference), embeddings_come_from_same_source))
        return CustomKNN(LpDistance())(query, k, reference)

    inference_model = InferenceModel(_trunk(), knn_func=my_knn)
    inference_model.train_knn(_data(1, 9))
    inference_model.get_nearest_neighbors(_data(2, 3), 2)
    assert calls == [(3, 2, 9, False)]


class _TextModel(torch.nn.Module):
    """A model of texts, as 2.x's tests use: one fixed random embedding per input."""

    def forward(self, texts: list[Any]) -> torch.Tensor:
        seeds = [zlib.crc32(repr(text).encode()) for text in texts]
        return torch.stack(
            [torch.randn(8, generator=torch.Generator().manual_seed(s)) for s in seeds]
        )


class _Texts(Dataset):
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.texts[i], 0


def test_a_2x_text_model_takes_datasets_and_lists_of_strings() -> None:
    texts = [f"text {i}" for i in range(70)]
    inference_model = InferenceModel(trunk=_TextModel())
    inference_model.train_knn(_Texts(texts))
    inference_model.add_to_knn([["extra 1", "extra 2"], ["extra 3", "extra 4"]])
    assert inference_model.reference_embeddings.shape == (72, 8)
    queries = ["text 5", "text 69", ["extra 3", "extra 4"]]
    _, indices = inference_model.get_nearest_neighbors(queries, k=10)
    assert indices[:, 0].tolist() == [5, 69, 71]


def test_a_2x_untrained_search_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        InferenceModel(trunk=_trunk()).get_nearest_neighbors(_data(1, 1), k=10)


# --- saving and loading a gallery -----------------------------------------------------------


def test_save_and_load_the_custom_gallery(tmp_path: os.PathLike[str]) -> None:
    trunk = _trunk(15)
    gallery, query = _data(16, 30), _data(17, 4)
    inference_model = InferenceModel(trunk)
    inference_model.train_knn(gallery)
    path = os.path.join(tmp_path, "gallery.pth")
    inference_model.save_knn_func(path)

    restored = InferenceModel(trunk)
    restored.load_knn_func(path)
    assert torch.equal(restored.reference_embeddings, inference_model.reference_embeddings)
    assert torch.equal(
        restored.get_nearest_neighbors(query, 5)[1],
        inference_model.get_nearest_neighbors(query, 5)[1],
    )


def test_a_failed_save_leaves_the_previous_file(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inference_model = InferenceModel(_trunk())
    inference_model.train_knn(_data(1, 5))
    path = os.path.join(tmp_path, "gallery.pth")
    inference_model.save_knn_func(path)
    before = Path(path).read_bytes()

    inference_model.train_knn(_data(2, 8))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        inference_model.save_knn_func(path)
    assert Path(path).read_bytes() == before
    assert os.listdir(tmp_path) == ["gallery.pth"]


def test_loading_a_file_that_is_not_a_gallery_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "model.pth")
    torch.save({"weight": torch.ones(2, 2)}, path)
    with pytest.raises(InvalidArgumentError, match="written by save_knn_func"):
        InferenceModel(_trunk()).load_knn_func(path)


def test_loading_a_damaged_file_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "gallery.pth")
    inference_model = InferenceModel(_trunk())
    inference_model.train_knn(_data(1, 5))
    inference_model.save_knn_func(path)
    Path(path).write_bytes(Path(path).read_bytes()[:40])  # truncated
    with pytest.raises(InvalidArgumentError, match="damaged"):
        InferenceModel(_trunk()).load_knn_func(path)
    Path(path).write_bytes(b"not a torch file")
    with pytest.raises(InvalidArgumentError, match="damaged"):
        InferenceModel(_trunk()).load_knn_func(path)


def test_save_without_a_gallery_says_what_to_do(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(InvalidArgumentError, match="call train_knn"):
        InferenceModel(_trunk()).save_knn_func(os.path.join(tmp_path, "g.pth"))
    assert os.listdir(tmp_path) == []


# --- matching ---------------------------------------------------------------------------


def test_get_matches_returns_2x_values() -> None:
    trunk = _trunk(18)
    query, ref = _data(19, 6), _data(20, 9)
    inference_model = InferenceModel(trunk)
    q, r = _embed_by_hand(trunk, query), _embed_by_hand(trunk, ref)
    threshold = 0.3
    expected = np.array([[_cosine(a, b) >= threshold for b in r] for a in q])

    matrix = inference_model.get_matches(query, ref, threshold=threshold)
    assert isinstance(matrix, np.ndarray) and matrix.dtype == bool
    assert np.array_equal(matrix, expected)
    pairs = inference_model.get_matches(query, ref, threshold=threshold, return_tuples=True)
    assert pairs == list(zip(*np.where(expected)))


def test_get_matches_without_ref_matches_queries_with_each_other() -> None:
    inference_model = InferenceModel(_trunk(), match_finder=MatchFinder(CosineSimilarity(), 0.999))
    matrix = inference_model.get_matches(_data(21, 5))
    assert np.array_equal(matrix, np.eye(5, dtype=bool))


def test_is_match_returns_a_bool_for_one_pair_and_an_array_for_several() -> None:
    trunk = _trunk(22)
    x, y = _data(23, 4), _data(24, 4)
    inference_model = InferenceModel(trunk, match_finder=MatchFinder(CosineSimilarity(), 0.2))
    expected = [
        _cosine(a, b) >= 0.2 for a, b in zip(_embed_by_hand(trunk, x), _embed_by_hand(trunk, y))
    ]
    single = inference_model.is_match(x[:1], y[:1])
    assert isinstance(single, bool) and single == expected[0]
    several = inference_model.is_match(x, y)
    assert isinstance(several, np.ndarray) and several.tolist() == expected
    assert inference_model.is_match(x, x, threshold=0.999).all()


# --- embedding ------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 5)
        self.batchnorm = torch.nn.BatchNorm1d(5)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.batchnorm(self.linear(x)))


def test_embedding_runs_in_eval_mode_and_restores_every_module_mode() -> None:
    trunk = _Net()
    trunk.train()
    trunk.batchnorm.eval()  # a mixed state, as a frozen-batchnorm training loop leaves it
    stats = trunk.batchnorm.running_mean.clone()
    inference_model = InferenceModel(trunk)
    x = _data(25, 8)
    first, second = inference_model.get_embeddings(x), inference_model.get_embeddings(x)
    assert torch.equal(first, second)  # dropout off
    assert torch.equal(trunk.batchnorm.running_mean, stats)  # batchnorm statistics untouched
    assert trunk.training and trunk.linear.training and trunk.dropout.training
    assert not trunk.batchnorm.training


def test_embeddings_are_normalized_unless_asked_not_to() -> None:
    trunk, x = _trunk(26), _data(27, 5)
    normalized = InferenceModel(trunk).get_embeddings(x)
    raw = InferenceModel(trunk, normalize_embeddings=False).get_embeddings(x)
    torch.testing.assert_close(
        normalized.double(),
        torch.tensor(_embed_by_hand(trunk, x), dtype=torch.float64),
        atol=1e-6,
        rtol=1e-6,
    )
    torch.testing.assert_close(
        raw.double(),
        torch.tensor(_embed_by_hand(trunk, x, normalize=False), dtype=torch.float64),
        atol=1e-5,
        rtol=1e-5,
    )


def test_embedder_and_dtype_are_applied() -> None:
    trunk = _trunk(28).double()
    embedder = torch.nn.Linear(4, 3).double()
    inference_model = InferenceModel(trunk, embedder=embedder, dtype=torch.float64)
    x = _data(29, 3)  # float32 input, cast to the model's float64
    embeddings = inference_model.get_embeddings(x)
    expected = torch.nn.functional.normalize(embedder(trunk(x.double())), dim=1)
    assert embeddings.dtype == torch.float64 and embeddings.shape == (3, 3)
    torch.testing.assert_close(embeddings, expected.detach())


# --- the match finder and the k-NN order agree (2.x issue #430) -------------------------------


def test_default_neighbours_are_ordered_by_the_match_finders_cosine() -> None:
    trunk = _trunk(30)
    gallery, query = _data(31, 40), _data(32, 6)
    inference_model = InferenceModel(trunk, normalize_embeddings=False)
    inference_model.train_knn(gallery)
    _, indices = inference_model.get_nearest_neighbors(query, k=6)
    expected, _ = _embedded_brute_force(trunk, query, gallery, 6, lambda a, b: -_cosine(a, b))
    assert indices.tolist() == expected


def test_default_neighbours_follow_a_euclidean_match_finder() -> None:
    trunk = _trunk(33)
    gallery, query = _data(34, 40), _data(35, 6)
    finder = MatchFinder(LpDistance(normalize_embeddings=False), threshold=1.0)
    inference_model = InferenceModel(trunk, match_finder=finder, normalize_embeddings=False)
    inference_model.train_knn(gallery)
    distances, indices = inference_model.get_nearest_neighbors(query, k=4)
    q = _embed_by_hand(trunk, query, normalize=False)
    g = _embed_by_hand(trunk, gallery, normalize=False)
    expected, squared = _brute_force(q, g, 4, _squared_euclidean)
    assert indices.tolist() == expected
    torch.testing.assert_close(
        distances.double() ** 2, torch.tensor(squared, dtype=torch.float64), atol=1e-4, rtol=1e-4
    )


def test_a_backend_that_disagrees_with_the_match_finder_is_warned_about() -> None:
    euclidean = CustomKNN(LpDistance(normalize_embeddings=False))
    with pytest.warns(UserWarning, match="#430"):
        InferenceModel(_trunk(), knn_func=euclidean, normalize_embeddings=False)
    # recorded, not raised: a registry reload may warn about an installed test plugin
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        InferenceModel(_trunk(), knn_func=euclidean)  # unit embeddings: the same order
        InferenceModel(_trunk(), knn_func="custom")
    assert [str(w.message) for w in caught if "#430" in str(w.message)] == []


# --- bad input ------------------------------------------------------------------------


def test_searching_before_train_knn_says_what_to_do() -> None:
    with pytest.raises(InvalidArgumentError, match="call train_knn"):
        InferenceModel(_trunk()).get_nearest_neighbors(_data(1, 2), 1)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(InvalidTypeError, match="'trunk' parameter of InferenceModel"):
        InferenceModel("resnet")
    with pytest.raises(InvalidTypeError, match="'match_finder' parameter"):
        InferenceModel(_trunk(), match_finder=CosineSimilarity())
    with pytest.raises(InvalidArgumentError, match="'data_device' parameter"):
        InferenceModel(_trunk(), data_device="gpu7")
    with pytest.raises(UnknownBackendError, match="no_such_backend"):
        InferenceModel(_trunk(), knn_func="no_such_backend")
    with pytest.raises(InvalidTypeError, match="'inputs' parameter"):
        InferenceModel(_trunk()).train_knn({"a": 1})
    with pytest.raises(InvalidArgumentError, match="at least one input"):
        InferenceModel(_trunk()).train_knn(torch.empty(0, 6))
    with pytest.raises(InvalidTypeError, match="'batch_size' parameter"):
        InferenceModel(_trunk()).train_knn(_data(1, 3), batch_size=2.5)


def test_asking_for_more_neighbours_than_the_gallery_holds_is_refused() -> None:
    inference_model = InferenceModel(_trunk())
    inference_model.train_knn(_data(1, 4))
    with pytest.raises(InvalidArgumentError, match="'k' parameter"):
        inference_model.get_nearest_neighbors(_data(2, 1), k=5)


def test_adding_embeddings_of_another_width_is_refused() -> None:
    inference_model = InferenceModel(torch.nn.Identity(), normalize_embeddings=False)
    inference_model.train_knn(_data(1, 4, dims=3))
    with pytest.raises(InvalidArgumentError, match="3 dimensions"):
        inference_model.add_to_knn(_data(2, 4, dims=5))


def test_a_model_returning_no_matrix_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="embedder\\(trunk\\(x\\)\\) output"):
        InferenceModel(lambda x: x.sum(dim=1)).get_embeddings(_data(1, 3))


class _Ramp(Dataset):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


def test_a_map_style_dataset_of_pairs_is_embedded_in_order() -> None:
    inference_model = InferenceModel(torch.nn.Identity(), normalize_embeddings=False)
    inference_model.train_knn(_Ramp(), batch_size=2)
    assert inference_model.reference_embeddings.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


# --- the module-level helpers -----------------------------------------------------------


def test_mask_reshape_knn_idx_drops_one_entry_per_row() -> None:
    x = torch.tensor([[7, 8, 9], [4, 5, 6]])
    mask = torch.tensor([[False, True, False], [False, False, True]])
    assert mask_reshape_knn_idx(x, mask).tolist() == [[7, 9], [4, 5]]


def test_return_results_removes_self_matches_or_the_last_neighbour() -> None:
    found_d = torch.tensor([[0.0, 0.1, 0.2], [0.3, 0.4, 0.5], [0.0, 0.6, 0.7]], dtype=torch.float64)
    found_i = torch.tensor([[0, 5, 6], [7, 1, 8], [9, 3, 4]])  # row 2 lacks its own index
    distances, indices = return_results(found_d, found_i, True)
    assert indices.tolist() == [[5, 6], [7, 8], [9, 3]]
    assert distances.tolist() == [[0.1, 0.2], [0.3, 0.5], [0.0, 0.6]]
    same_d, same_i = return_results(found_d, found_i, False)
    assert same_d is found_d and same_i is found_i


@given(st.data())
def test_return_results_matches_a_plain_loop(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 6))
    width = data.draw(st.integers(2, 5))
    pool = st.lists(st.integers(0, 8), min_size=width, max_size=width, unique=True)
    found_i = torch.tensor(data.draw(st.lists(pool, min_size=rows, max_size=rows)))
    found_d = torch.arange(rows * width, dtype=torch.float64).view(rows, width)
    distances, indices = return_results(found_d, found_i, True)
    for row in range(rows):
        own = found_i[row].tolist()
        drop = own.index(row) if row in own else width - 1
        keep = [j for j in range(width) if j != drop]
        assert indices[row].tolist() == [own[j] for j in keep]
        assert distances[row].tolist() == [float(found_d[row, j]) for j in keep]


@pytest.mark.parametrize("get_largest", [False, True])
def test_get_topk_fills_blocks_as_2x_custom_knn_did(get_largest: bool) -> None:
    query, reference, k = _data(40, 11, 3), _data(41, 9, 3), 3
    distances = torch.zeros(len(query), k)
    indices = torch.zeros(len(query), k, dtype=torch.long)
    euclidean = LpDistance(normalize_embeddings=False)
    batched = BatchedDistance(euclidean, get_topk(distances, indices, k, get_largest), 4)
    batched(query, reference)
    for row, q in enumerate(query.tolist()):
        values = [math.dist(q, r) for r in reference.tolist()]
        sign = -1 if get_largest else 1
        order = sorted(range(len(values)), key=lambda j: sign * values[j])[:k]
        assert indices[row].tolist() == order
        assert distances[row].tolist() == pytest.approx([values[j] for j in order], abs=1e-5)


def test_every_2x_name_is_exported() -> None:
    names = {
        "CustomKNN", "FaissKMeans", "FaissKNN", "InferenceModel", "MatchFinder",
        "add_to_index_and_search", "convert_to_cpu_index", "convert_to_gpu_index", "get_topk",
        "mask_reshape_knn_idx", "return_results", "run_pca", "try_gpu",
    }  # fmt: skip
    assert names <= set(inference.__all__)
    assert all(callable(getattr(inference, name)) for name in names)
