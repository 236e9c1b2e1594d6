"""faiss_pca: standardize, then project; compared with scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning_faiss import faiss_pca, standardize

pytestmark = pytest.mark.faiss


def _correlated(seed: int, rows: int, cols: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(cols, cols, generator=generator)
    scales = torch.logspace(0, 2, cols)
    return (torch.randn(rows, cols, generator=generator) * scales) @ mixing + 5.0


@given(
    seed=st.integers(0, 2**31 - 1), rows=st.integers(8, 60), cols=st.integers(2, 8), data=st.data()
)
def test_matches_scikit_learn_up_to_sign(
    seed: int, rows: int, cols: int, data: st.DataObject
) -> None:
    dims = data.draw(st.integers(1, min(rows, cols)))
    x = _correlated(seed, rows, cols)
    scaled = StandardScaler().fit_transform(x.double().numpy())
    oracle = PCA(n_components=dims, svd_solver="full").fit(scaled)
    # Components must be well separated for their directions to be defined.
    variances = oracle.explained_variance_
    assume(np.all(np.abs(np.diff(variances)) > 1e-2 * variances[0]))
    assume(
        dims == cols
        or PCA(n_components=dims + 1).fit(scaled).explained_variance_[-1] < 0.99 * variances[-1]
    )
    expected = oracle.transform(scaled)
    projected = faiss_pca(x, dims).double().numpy()
    signs = np.sign((projected * expected).sum(axis=0))
    np.testing.assert_allclose(
        projected * signs, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max()
    )


def test_standardize_matches_scikit_learn() -> None:
    x = _correlated(0, 30, 5)
    x[:, 2] = 7.0  # a constant column becomes zeros
    expected = StandardScaler().fit_transform(x.double().numpy())
    np.testing.assert_allclose(standardize(x.double()).numpy(), expected, atol=1e-10)


def test_standardizes_before_projecting() -> None:
    # Column 0 has a huge scale but no correlation; after standardizing it no longer dominates.
    generator = torch.Generator().manual_seed(0)
    signal = torch.randn(500, 1, generator=generator)
    noise = torch.randn(500, 3, generator=generator) * 0.1
    x = torch.cat([torch.randn(500, 1, generator=generator) * 1000, signal + noise], dim=1)
    first = faiss_pca(x, 1)[:, 0].double()
    correlation = torch.corrcoef(torch.stack([first, signal[:, 0].double()]))[0, 1]
    assert abs(float(correlation)) > 0.99


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_output_shape_dtype_and_device(dtype: torch.dtype) -> None:
    x = _correlated(1, 20, 6).to(dtype)
    out = faiss_pca(x, 3)
    assert out.shape == (20, 3) and out.dtype == dtype and out.device == x.device


@pytest.mark.parametrize(
    ("shape", "dims", "error"),
    [
        ((10, 4), 5, InvalidArgumentError),
        ((3, 6), 4, InvalidArgumentError),
        ((10, 4), 0, InvalidArgumentError),
        ((10, 4), 2.0, InvalidTypeError),
    ],
)
def test_dims_is_validated(shape: tuple[int, int], dims: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="'dims' parameter of faiss_pca"):
        faiss_pca(torch.randn(*shape), dims)  # type: ignore[arg-type]


def test_x_is_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="'x' parameter of faiss_pca"):
        faiss_pca(torch.randn(4), 1)
