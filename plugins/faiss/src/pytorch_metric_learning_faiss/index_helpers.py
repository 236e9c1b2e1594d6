"""The faiss helper functions of pytorch-metric-learning 2.x's ``utils.inference``.

2.x code calls these on faiss indices it builds itself; the core re-exports them from
``pytorch_metric_learning.utils.inference`` and loads this module only when one is called.
They take and return tensors (float32 distances, int64 indices on the CPU), as 2.x did with
``faiss.contrib.torch_utils``. New code should use :class:`FaissKNN` or :func:`faiss_pca`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import faiss
import numpy as np
import torch

from pytorch_metric_learning._validation import check_finite, check_positive_int, check_tensor
from pytorch_metric_learning._validation import invalid as _invalid
from pytorch_metric_learning.errors import BackendRuntimeError, InvalidArgumentError

from . import _gpu
from ._interop import LOGGER_PREFIX, faiss_errors, from_numpy

__all__ = [
    "add_to_index_and_search",
    "convert_to_cpu_index",
    "convert_to_gpu_index",
    "run_pca",
    "try_gpu",
]

logger = logging.getLogger(f"{LOGGER_PREFIX}.index_helpers")


def add_to_index_and_search(
    index: Any, query: torch.Tensor, reference: torch.Tensor | None, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append ``reference`` to ``index`` (if given), then search it for ``query``'s k nearest.

    Returns ``(distances, indices)`` as CPU tensors (float32 and int64), nearest first.

    Example:
        >>> index = faiss.IndexFlatL2(1)
        >>> reference = torch.tensor([[0.0], [2.0], [5.0]])
        >>> distances, indices = add_to_index_and_search(index, torch.tensor([[1.8]]), reference, 2)
        >>> indices.tolist(), [round(d, 4) for d in distances[0].tolist()], index.ntotal
        ([[1, 0]], [0.04, 3.24], 3)
    """
    owner = "add_to_index_and_search"
    k = check_positive_int(k, "k", owner)
    if reference is not None:
        rows = _float32_rows(reference, "reference", owner)
        with faiss_errors(owner, f"add {len(rows)} rows to the index"):
            index.add(rows)
    if k > index.ntotal:
        raise InvalidArgumentError(
            f"The 'k' parameter of {owner} must be at most the {index.ntotal} rows of the "
            f"index (faiss would pad the result with -1). Got {k} instead."
        )
    queries = _float32_rows(query, "query", owner)
    with faiss_errors(owner, f"search {len(queries)} queries for {k} neighbours"):
        distances, indices = index.search(queries, k)
    return from_numpy(distances, torch.float32, torch.device("cpu")), from_numpy(
        indices, torch.long, torch.device("cpu")
    )


def convert_to_gpu_index(index: Any, gpus: Sequence[int] | None = None) -> Any:
    """A copy of ``index`` on the GPUs ``gpus`` (all visible GPUs if None); a GPU index as is.

    Raises ``BackendRuntimeError`` when this faiss has no GPU support (faiss-cpu).
    """
    if _gpu.index_gpus(index, faiss):
        return index
    if not _gpu.gpu_environment(faiss).gpu_build:
        raise BackendRuntimeError(
            "convert_to_gpu_index needs a GPU build of faiss; this faiss has no GPU support "
            "(faiss-cpu). Search on the CPU, or install a GPU build of faiss."
        )
    with faiss_errors("convert_to_gpu_index", "copy the index to GPUs"):
        if gpus is None:
            return faiss.index_cpu_to_all_gpus(index)
        return faiss.index_cpu_to_gpus_list(index, gpus=list(gpus))


def convert_to_cpu_index(index: Any) -> Any:
    """A CPU copy of a GPU (or sharded multi-GPU) index; a CPU index is returned as is.

    Example:
        >>> index = faiss.IndexFlatL2(4)
        >>> convert_to_cpu_index(index) is index
        True
    """
    if not _gpu.index_gpus(index, faiss):
        return index
    with faiss_errors("convert_to_cpu_index", "copy the index to the CPU"):
        return faiss.index_gpu_to_cpu(index)


def try_gpu(
    index: Any, query: torch.Tensor, reference: torch.Tensor | None, k: int, is_cuda: bool,
    gpus: Sequence[int] | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`add_to_index_and_search` on GPUs when asked for and possible, else on the CPU.

    A GPU is used when ``is_cuda`` or ``gpus`` asks for one, faiss sees a GPU, and ``k`` is
    at most the 2048 neighbours a faiss GPU search returns (beyond that: a logged warning
    and the CPU). A CPU ``index`` keeps the added rows only when the search runs on the CPU.

    Example:
        >>> index = faiss.IndexFlatL2(1)
        >>> reference = torch.tensor([[0.0], [2.0], [5.0]])
        >>> try_gpu(index, torch.tensor([[4.0]]), reference, 1, False, None)[1].tolist()
        [[2]]
    """
    asks_for_gpu = bool(is_cuda) or gpus is not None
    if asks_for_gpu and _gpu.gpu_environment(faiss).num_gpus > 0:
        if _gpu.k_fits_gpu(k):
            return add_to_index_and_search(convert_to_gpu_index(index, gpus), query, reference, k)
        logger.warning(
            "Using CPU for k-nn search because k = %d > %d, which is the maximum allowable on GPU.",
            k,
            _gpu.GPU_MAX_K,
        )
    return add_to_index_and_search(convert_to_cpu_index(index), query, reference, k)


@torch.no_grad()
def run_pca(x: torch.Tensor, output_dimensionality: int) -> torch.Tensor:
    """Project the rows of ``x`` onto its first ``output_dimensionality`` principal components.

    As in 2.x, the data is centred but not scaled (:func:`faiss_pca` also standardizes the
    columns). Returns float32 values on x's device; each component's sign is arbitrary.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        >>> projected = run_pca(x, 1).abs().flatten() / 2**0.5
        >>> [round(value, 4) for value in projected.tolist()]
        [1.5, 0.5, 0.5, 1.5]
    """
    owner = "run_pca"
    dims = check_positive_int(output_dimensionality, "output_dimensionality", owner)
    rows = _float32_rows(x, "x", owner)
    if dims > rows.shape[1]:
        raise InvalidArgumentError(
            f"The 'output_dimensionality' parameter of {owner} must be at most the "
            f"{rows.shape[1]} columns of x. Got {dims} instead."
        )
    with faiss_errors(owner, f"compute a {dims}-component PCA of {rows.shape} data"):
        pca = faiss.PCAMatrix(rows.shape[1], dims)
        pca.train(rows)
        projected = pca.apply(rows)
    return from_numpy(projected, torch.float32, x.device)


def _float32_rows(x: Any, param: str, owner: str) -> np.ndarray:
    """A 2-D tensor of numbers as a C-contiguous float32 array (2.x cast with ``.float()``)."""
    check_tensor(x, param, owner)
    if x.ndim != 2 or x.is_complex():
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}"
        raise _invalid(param, owner, "a 2-D real tensor (rows, dims)", got)
    rows = x.detach().to(device="cpu", dtype=torch.float32)
    check_finite(rows, param, owner)
    return np.ascontiguousarray(rows.numpy())
