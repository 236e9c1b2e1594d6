"""The PyTorch PCA of the testers: standardize, then project; compared with scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.testers._pca import fit_pca


def correlated(num: int, dims: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(dims, dims, generator=generator)
    scales = torch.linspace(0.5, 4.0, dims)
    return (torch.randn(num, dims, generator=generator) @ mixing) * scales + 3.0


def sklearn_projection(reference: np.ndarray, x: np.ndarray, dims: int) -> np.ndarray:
    scaler = StandardScaler().fit(reference)
    pca = PCA(n_components=dims, svd_solver="full").fit(scaler.transform(reference))
    return pca.transform(scaler.transform(x))


def assert_equal_up_to_sign(actual: np.ndarray, expected: np.ndarray, atol: float) -> None:
    signs = np.sign((actual * expected).sum(0))
    np.testing.assert_allclose(actual * signs, expected, atol=atol, rtol=0)


@given(st.integers(2, 8), st.integers(0, 2**16))
def test_equals_standardize_then_sklearn_pca(dims: int, seed: int) -> None:
    x = correlated(60, 8, seed).double()
    out = fit_pca(x, dims).transform(x)
    assert out.shape == (60, dims)
    assert_equal_up_to_sign(out.numpy(), sklearn_projection(x.numpy(), x.numpy(), dims), 1e-7)


def test_fitted_on_reference_and_applied_to_another_set() -> None:
    reference, query = correlated(80, 6, 1).double(), correlated(20, 6, 2).double()
    projection = fit_pca(reference, 3)
    out = projection.transform(query).numpy()
    assert_equal_up_to_sign(out, sklearn_projection(reference.numpy(), query.numpy(), 3), 1e-7)


def test_components_are_in_decreasing_variance_order() -> None:
    x = correlated(200, 6, 3).double()
    variances = fit_pca(x, 6).transform(x).var(0, unbiased=False)
    assert torch.all(variances[:-1] >= variances[1:])


def test_keeps_input_dtype_and_device() -> None:
    x = correlated(30, 5, 4)
    out = fit_pca(x, 2).transform(x)
    assert out.dtype == torch.float32 and out.device == x.device


def test_constant_column_is_not_a_division_by_zero() -> None:
    x = correlated(40, 4, 5).double()
    x[:, 2] = 7.0
    out = fit_pca(x, 3).transform(x)
    assert torch.isfinite(out).all()
    expected = sklearn_projection(x.numpy(), x.numpy(), 3)
    assert_equal_up_to_sign(out.numpy(), expected, 1e-7)


def test_more_dims_than_the_embedding_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'pca' parameter of Owner.*at most .*\(4\)"):
        fit_pca(torch.randn(10, 4), 5, owner="Owner")


def test_blocks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytorch_metric_learning.testers._pca as pca_module

    x = correlated(50, 5, 6).double()
    whole = fit_pca(x, 3).transform(x)
    monkeypatch.setattr(pca_module, "_BLOCK_ROWS", 7)
    blocked = fit_pca(x, 3).transform(x)
    assert_equal_up_to_sign(blocked.numpy(), whole.numpy(), 1e-10)


@pytest.mark.faiss
def test_matches_the_faiss_plugin_pca_up_to_sign() -> None:
    plugin = pytest.importorskip("pytorch_metric_learning_faiss")
    x = correlated(100, 8, 7)
    ours = fit_pca(x, 4).transform(x)
    theirs = torch.as_tensor(np.asarray(plugin.faiss_pca(x, 4)), dtype=torch.float32)
    assert_equal_up_to_sign(ours.numpy(), theirs.numpy(), 1e-3)
