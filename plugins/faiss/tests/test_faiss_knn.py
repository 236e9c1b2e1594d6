"""FaissKNN on the CPU: the KNNFunc contract, index life cycle, options and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import faiss
import numpy as np
import pytest
import torch
from faiss_test_helpers import brute_force_knn, has_clear_gaps
from hypothesis import assume, given
from hypothesis import strategies as st

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import (
    BackendRuntimeError,
    FileWriteError,
    InvalidArgumentError,
    InvalidTypeError,
    PMLError,
)
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning_faiss import FaissKNN, IndexFileNotFoundError

pytestmark = pytest.mark.faiss

SQUARED_EUCLIDEAN = LpDistance(normalize_embeddings=False, power=2)


def _data(seed: int, rows: int, dims: int) -> torch.Tensor:
    return torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))


# --- agreement with CustomKNN and a brute-force oracle -----------------------------------


@given(
    seed=st.integers(0, 2**31 - 1),
    num_query=st.integers(1, 30),
    extra=st.integers(0, 40),
    dims=st.integers(1, 16),
    k=st.integers(1, 8),
    ref_includes_query=st.booleans(),
)
def test_agrees_with_custom_knn(
    seed: int, num_query: int, extra: int, dims: int, k: int, ref_includes_query: bool
) -> None:
    reference = _data(seed, num_query + extra, dims) * 3
    query = reference[:num_query] if ref_includes_query else _data(seed + 1, num_query, dims) * 3
    assume(k + ref_includes_query <= len(reference))
    assume(has_clear_gaps(query, reference, k, gap=1e-3))
    expected = CustomKNN(SQUARED_EUCLIDEAN)(query, k, reference, ref_includes_query)
    distances, indices = FaissKNN()(query, k, reference, ref_includes_query)
    assert torch.equal(indices, expected[1])
    torch.testing.assert_close(distances, expected[0].float(), rtol=1e-4, atol=1e-4)


def test_matches_brute_force_above_the_blas_threshold() -> None:
    # faiss switches to a BLAS distance computation from 20 queries on.
    query, reference = _data(0, 64, 24), _data(1, 300, 24)
    expected_distances, expected_indices = brute_force_knn(query, reference, 5)
    distances, indices = FaissKNN()(query, 5, reference)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(distances, expected_distances.float(), rtol=1e-4, atol=1e-4)


def test_outputs_follow_the_contract() -> None:
    query = _data(0, 7, 4).requires_grad_()
    distances, indices = FaissKNN()(query, 3, _data(1, 20, 4))
    assert distances.shape == indices.shape == (7, 3)
    assert distances.dtype == torch.float32 and indices.dtype == torch.long
    assert distances.device == indices.device == query.device
    assert not distances.requires_grad
    assert bool((distances.diff(dim=1) >= 0).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_other_float_dtypes_are_searched_as_float32(dtype: torch.dtype) -> None:
    query, reference = _data(0, 6, 5).to(dtype), _data(1, 30, 5).to(dtype)
    expected_distances, expected_indices = brute_force_knn(query.float(), reference.float(), 4)
    distances, indices = FaissKNN()(query, 4, reference)
    assert distances.dtype == torch.float32
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(distances, expected_distances.float(), rtol=1e-4, atol=1e-4)


def test_self_match_missing_drops_the_last_neighbour() -> None:
    # By inner product, rows 2 and 1 beat row 0 itself, so row 0 is not among its 2 results.
    reference = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [-1.0, 0.0]])
    knn = FaissKNN(index_init_fn=faiss.IndexFlatIP)
    distances, indices = knn(reference[:1], 1, reference, ref_includes_query=True)
    assert indices.tolist() == [[2]] and distances.tolist() == [[3.0]]
    distances, indices = knn(reference[:1], 2, reference, ref_includes_query=True)
    assert indices.tolist() == [[2, 1]]


def test_index_init_fn_chooses_the_metric() -> None:
    query, reference = _data(0, 5, 6), _data(1, 25, 6)
    distances, indices = FaissKNN(index_init_fn=faiss.IndexFlatIP)(query, 3, reference)
    expected = torch.topk(query.double() @ reference.double().T, 3, dim=1)
    assert torch.equal(indices, expected.indices)
    torch.testing.assert_close(distances, expected.values.float(), rtol=1e-4, atol=1e-4)


def test_default_index_is_flat_l2() -> None:
    knn = FaissKNN(reset_after=False)
    knn(_data(0, 2, 3), 1, _data(1, 4, 3))
    assert isinstance(knn.index, faiss.IndexFlatL2)


# --- index life cycle ---------------------------------------------------------------------


def test_reset_before_builds_a_new_index_each_call() -> None:
    knn = FaissKNN(reset_before=True, reset_after=False)
    knn(_data(0, 3, 4), 1, _data(1, 10, 4))
    knn(_data(0, 3, 4), 1, _data(2, 15, 4))
    assert knn.index.ntotal == 15


def test_reset_after_discards_the_index() -> None:
    knn = FaissKNN()
    knn(_data(0, 3, 4), 1, _data(1, 10, 4))
    assert knn.index is None


def test_reset_after_discards_the_index_after_a_failed_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    knn = FaissKNN(reset_before=False, reset_after=True)

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(faiss.IndexFlatL2, "search", fail)
    with pytest.raises(BackendRuntimeError):
        knn(_data(0, 3, 4), 1, _data(1, 10, 4))
    assert knn.index is None


def test_accumulated_rows_continue_the_numbering() -> None:
    first, second = _data(0, 10, 4), _data(1, 6, 4)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn(first[:1], 1, first)
    distances, indices = knn(second, 1, second)
    assert indices[:, 0].tolist() == list(range(10, 16))
    assert knn.index.ntotal == 16
    assert distances.abs().max() < 1e-5


def test_accumulation_searches_duplicated_rows() -> None:
    reference = _data(0, 8, 3)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn(reference[:1], 1, reference)
    _, indices = knn(reference[:2], 2, reference)
    assert [sorted(row) for row in indices.tolist()] == [[0, 8], [1, 9]]


def test_search_without_reference_uses_the_persistent_index() -> None:
    reference, query = _data(0, 30, 5), _data(1, 4, 5)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(reference)
    distances, indices = knn(query, 3)
    expected_distances, expected_indices = brute_force_knn(query, reference, 3)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(distances, expected_distances.float(), rtol=1e-4, atol=1e-4)
    assert knn.index.ntotal == 30


def test_train_replaces_and_add_appends() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.add(_data(0, 5, 3))  # no index yet: a new one
    knn.train(_data(1, 7, 3))
    assert knn.index.ntotal == 7
    more = _data(2, 4, 3)
    knn.add(more)
    assert knn.index.ntotal == 11
    assert knn(more, 1)[1][:, 0].tolist() == [7, 8, 9, 10]


def test_index_is_the_live_index_and_none_when_empty() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    assert knn.index is None
    knn.train(_data(0, 6, 3))
    assert knn.index is knn.faiss_index and knn.index.ntotal == 6
    knn.reset()
    assert knn.index is None


def test_index_set_as_in_2x_is_the_one_searched() -> None:
    reference, query = _data(0, 20, 4), _data(1, 3, 4)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.index = faiss.IndexFlatIP(4)  # 2.x code sets the index itself
    knn.index.add(reference.numpy())
    distances, indices = knn(query, 2)
    scores = [[float(q @ r) for r in reference.double()] for q in query.double()]
    expected = [sorted(range(20), key=lambda j: -row[j])[:2] for row in scores]
    assert indices.tolist() == expected
    assert knn.index.ntotal == 20


def test_index_set_gets_the_search_parameters() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False, nprobe=4)
    ivf = faiss.index_factory(3, "IVF2,Flat")
    knn.index = ivf
    assert faiss.extract_index_ivf(knn.index).nprobe == 4


def test_index_rejects_what_is_not_a_faiss_index() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    with pytest.raises(InvalidTypeError, match="'index' parameter of FaissKNN"):
        knn.index = "IVF2,Flat"
    assert knn.index is None


def test_factory_string_is_kept_as_index_string() -> None:
    knn = FaissKNN(index="HNSW32", reset_after=False)
    assert knn.index_string == "HNSW32" and knn.index is None
    knn(_data(0, 2, 4), 1, _data(1, 10, 4))
    assert isinstance(faiss.downcast_index(knn.index), faiss.IndexHNSWFlat)


def test_distance_names_the_metric_of_the_index() -> None:
    assert FaissKNN().distance.power == 2 and not FaissKNN().distance.is_inverted
    assert FaissKNN(index_init_fn=faiss.IndexFlatIP).distance is None  # not built yet
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.index = faiss.IndexFlatIP(3)
    assert knn.distance.is_inverted and not knn.distance.normalize_embeddings
    reference, query = _data(0, 12, 3), _data(1, 4, 3)
    knn.add(reference)
    # the distance object reproduces the values and order the index returns
    distances, indices = knn(query, 3)
    expected = CustomKNN(knn.distance)(query, 3, reference)
    assert torch.equal(indices, expected[1])
    torch.testing.assert_close(distances, expected[0], rtol=1e-4, atol=1e-4)


def test_train_and_add_take_numpy_arrays_as_2x_did() -> None:
    reference = _data(0, 9, 3)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(reference[:5].numpy())
    knn.add(reference[5:].numpy().astype(np.float64))
    assert knn(reference, 1)[1][:, 0].tolist() == list(range(9))


def test_save_and_load_round_trip(tmp_path: os.PathLike[str]) -> None:
    reference, query = _data(0, 40, 6), _data(1, 5, 6)
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(reference)
    path = os.path.join(tmp_path, "x.index")
    knn.save(path)
    restored = FaissKNN(reset_before=False, reset_after=False)
    restored.load(tmp_path / "x.index")  # type: ignore[operator]
    assert restored.index.ntotal == 40
    assert torch.equal(restored(query, 4)[1], brute_force_knn(query, reference, 4)[1])


def test_load_of_a_missing_file_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "missing.index")
    with pytest.raises(IndexFileNotFoundError, match="no such file") as caught:
        FaissKNN(reset_before=False).load(path)
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, PMLError)
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize("cut", [0, 1, 4, 8, 20, 40, -1])
def test_load_of_a_damaged_file_is_a_clear_error(tmp_path: os.PathLike[str], cut: int) -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(_data(0, 3, 4))
    path = os.path.join(tmp_path, "x.index")
    knn.save(path)
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[:cut])
    restored = FaissKNN(reset_before=False, reset_after=False)
    with pytest.raises(BackendRuntimeError, match="not a faiss index file") as caught:
        restored.load(path)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert restored.index is None


def test_save_into_a_missing_directory_creates_it(tmp_path: os.PathLike[str]) -> None:
    """As InferenceModel.save_knn_func does: the folder is created, the index loads back."""
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(_data(0, 3, 4))
    path = os.path.join(tmp_path, "no", "such", "dir.index")
    knn.save(path)
    assert faiss.read_index(path).ntotal == knn.index.ntotal


def test_save_where_the_folder_cannot_be_created(tmp_path: os.PathLike[str]) -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(_data(0, 3, 4))
    blocking = os.path.join(tmp_path, "a_file")
    with open(blocking, "wb") as handle:
        handle.write(b"x")
    with pytest.raises(FileWriteError, match="a_file"):
        knn.save(os.path.join(blocking, "sub", "x.index"))


def test_save_without_an_index() -> None:
    with pytest.raises(InvalidArgumentError, match="no index to save"):
        FaissKNN().save("x.index")


# --- approximate indices ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind"), [("IVF4,Flat", faiss.IndexIVFFlat), ("HNSW32", faiss.IndexHNSWFlat)]
)
def test_index_factory_string_trains_on_the_reference(spec: str, kind: type) -> None:
    reference, query = _data(0, 400, 8), _data(1, 10, 8)
    knn = FaissKNN(reset_after=False, index=spec, nprobe=4 if "IVF" in spec else None)
    distances, indices = knn(query, 5, reference)
    assert isinstance(faiss.downcast_index(knn.index), kind)
    assert knn.index.is_trained and knn.index.ntotal == 400
    expected = brute_force_knn(query, reference, 5)[1]
    # Every list probed (IVF) or a 400-row graph (HNSW): the search is exact here.
    assert torch.equal(indices, expected)


def test_nprobe_and_ef_search_reach_the_index() -> None:
    reference = _data(0, 300, 4)
    ivf = FaissKNN(reset_after=False, index="IVF8,Flat", nprobe=3)
    ivf(reference[:2], 1, reference)
    assert faiss.extract_index_ivf(ivf.index).nprobe == 3
    hnsw = FaissKNN(reset_after=False, index="HNSW16", efSearch=77)
    hnsw(reference[:2], 1, reference)
    assert faiss.downcast_index(hnsw.index).hnsw.efSearch == 77


def test_search_params_apply_to_a_loaded_index(tmp_path: os.PathLike[str]) -> None:
    knn = FaissKNN(reset_before=False, reset_after=False, index="IVF8,Flat")
    knn.train(_data(0, 300, 4))
    path = os.path.join(tmp_path, "ivf.index")
    knn.save(path)
    restored = FaissKNN(reset_before=False, reset_after=False, nprobe=5)
    restored.load(path)
    assert faiss.extract_index_ivf(restored.index).nprobe == 5


def test_nprobe_on_a_flat_index_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="'nprobe' parameter of FaissKNN"):
        FaissKNN(nprobe=4)(_data(0, 2, 4), 1, _data(1, 10, 4))


def test_missing_neighbours_are_an_error_not_minus_one() -> None:
    # Two far-apart clusters; probing one list of two cannot find 30 neighbours of 30.
    generator = torch.Generator().manual_seed(0)
    near = torch.randn(15, 2, generator=generator)
    reference = torch.cat([near, near + 100.0])
    knn = FaissKNN(index="IVF2,Flat", nprobe=1)
    with pytest.raises(BackendRuntimeError, match="fewer than 30 neighbours"):
        knn(reference[:3], 30, reference)


def test_bad_factory_string() -> None:
    with pytest.raises(InvalidArgumentError, match="'index' parameter of FaissKNN") as caught:
        FaissKNN(index="NoSuchIndex")(_data(0, 2, 4), 1, _data(1, 10, 4))
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_faiss_runtime_errors_become_backend_runtime_errors() -> None:
    # IVF64 cannot be trained on 10 rows; the faiss error is chained, never swallowed.
    with pytest.raises(BackendRuntimeError, match="could not add 10 rows") as caught:
        FaissKNN(index="IVF64,Flat")(_data(0, 2, 4), 1, _data(1, 10, 4))
    assert isinstance(caught.value, RuntimeError)
    assert type(caught.value.__cause__) is RuntimeError
    assert "training points" in str(caught.value)


# --- bad input -----------------------------------------------------------------------------


def test_k_larger_than_the_index_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="at most 10"):
        FaissKNN()(_data(0, 2, 4), 11, _data(1, 10, 4))
    with pytest.raises(InvalidArgumentError, match="at most 9"):
        FaissKNN()(_data(1, 2, 4), 10, _data(1, 10, 4), ref_includes_query=True)


def test_k_larger_than_a_persistent_index_leaves_it_unchanged() -> None:
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(_data(0, 5, 4))
    with pytest.raises(InvalidArgumentError, match="at most 8"):
        knn(_data(1, 2, 4), 9, _data(2, 3, 4))
    assert knn.index.ntotal == 5


@pytest.mark.parametrize("k", [0, -1])
def test_k_must_be_positive(k: int) -> None:
    with pytest.raises(InvalidArgumentError, match="'k' parameter of FaissKNN"):
        FaissKNN()(_data(0, 2, 4), k, _data(1, 10, 4))


@pytest.mark.parametrize("k", [1.5, "3", True])
def test_k_must_be_an_int(k: object) -> None:
    with pytest.raises(InvalidTypeError, match="'k' parameter of FaissKNN"):
        FaissKNN()(_data(0, 2, 4), k, _data(1, 10, 4))  # type: ignore[arg-type]


def test_reset_before_without_reference_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="'reference' parameter of FaissKNN"):
        FaissKNN()(_data(0, 2, 4), 1)


def test_persistent_search_without_any_index_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="no index to search"):
        FaissKNN(reset_before=False)(_data(0, 2, 4), 1)


def test_columns_must_match() -> None:
    with pytest.raises(InvalidArgumentError, match="same number of columns"):
        FaissKNN()(_data(0, 2, 4), 1, _data(1, 10, 5))
    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(_data(0, 5, 4))
    with pytest.raises(InvalidArgumentError, match=r"as many columns as the index \(4\)"):
        knn(_data(1, 2, 3), 1)
    with pytest.raises(InvalidArgumentError, match=r"as many columns as the index \(4\)"):
        knn.add(_data(1, 2, 3))


@pytest.mark.parametrize(
    ("query", "error"),
    [
        (torch.zeros(3), InvalidArgumentError),
        (torch.zeros(2, 3, dtype=torch.long), InvalidTypeError),
        (torch.tensor([[0.0, float("nan")]]), InvalidArgumentError),
        (np.zeros((2, 2), dtype=np.float32), InvalidTypeError),
    ],
)
def test_bad_queries(query: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="FaissKNN"):
        FaissKNN()(query, 1, torch.zeros(4, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("gpus", [0, "0", {0}, range(2)])
def test_gpus_must_be_a_list_or_tuple(gpus: object) -> None:
    with pytest.raises(TypeError, match="'gpus' parameter of FaissKNN"):
        FaissKNN(gpus=gpus)  # type: ignore[arg-type]


@pytest.mark.parametrize("gpus", [[], ()])
def test_gpus_must_not_be_empty(gpus: object) -> None:
    with pytest.raises(ValueError, match="'gpus' parameter of FaissKNN"):
        FaissKNN(gpus=gpus)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpus", "error"), [([-1], ValueError), ([0, 0], ValueError), ([0.0], TypeError)]
)
def test_gpus_must_be_distinct_ids(gpus: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="'gpus' parameter of FaissKNN"):
        FaissKNN(gpus=gpus)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"reset_before": 1}, InvalidTypeError),
        ({"reset_after": None}, InvalidTypeError),
        ({"index_init_fn": "IndexFlatL2"}, InvalidTypeError),
        ({"index": 32}, InvalidTypeError),
        ({"index": ""}, InvalidTypeError),
        ({"index": "HNSW32", "index_init_fn": faiss.IndexFlatL2}, InvalidArgumentError),
        ({"nprobe": 0}, InvalidArgumentError),
        ({"efSearch": 2.5}, InvalidTypeError),
    ],
)
def test_bad_options(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match="FaissKNN"):
        FaissKNN(**kwargs)  # type: ignore[arg-type]


def test_index_init_fn_must_return_a_faiss_index_of_the_dimension() -> None:
    with pytest.raises(InvalidArgumentError, match="'index_init_fn' parameter"):
        FaissKNN(index_init_fn=lambda d: object())(_data(0, 2, 4), 1, _data(1, 5, 4))
    with pytest.raises(InvalidArgumentError, match=r"as many columns as the index \(3\)"):
        FaissKNN(index_init_fn=lambda d: faiss.IndexFlatL2(3))(_data(0, 2, 4), 1, _data(1, 5, 4))


def test_faiss_cpu_ignores_gpus_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    query, reference = _data(0, 3, 4), _data(1, 10, 4)
    knn = FaissKNN(gpus=[0])
    with caplog.at_level("WARNING", logger="pytorch_metric_learning"):
        knn(query, 2, reference)
        _, indices = knn(query, 2, reference)
    assert torch.equal(indices, brute_force_knn(query, reference, 2)[1])
    warnings = [r for r in caplog.records if "no GPU support" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].name.startswith("pytorch_metric_learning.")


def test_repr_shows_the_options() -> None:
    text = repr(FaissKNN(reset_after=False, index="HNSW32", efSearch=64))
    assert "reset_after=False" in text and "index='HNSW32'" in text and "efSearch=64" in text


def test_the_environment_is_never_changed() -> None:
    script = textwrap.dedent(
        """
        import os
        before = dict(os.environ)
        import torch
        from pytorch_metric_learning.evaluation import FaissKMeans, FaissKNN
        from pytorch_metric_learning_faiss import faiss_pca
        x = torch.randn(60, 4)
        FaissKNN()(x, 3, x, True)
        FaissKMeans()(x, 2)
        faiss_pca(x, 2)
        print(dict(os.environ) == before)
        """
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("KMP_DUPLICATE_LIB_OK", "OMP_NUM_THREADS")
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert result.stdout.strip() == "True"
