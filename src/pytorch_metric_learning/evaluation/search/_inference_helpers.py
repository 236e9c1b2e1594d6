"""The module-level k-NN helpers of pytorch-metric-learning 2.x's ``utils.inference``.

``mask_reshape_knn_idx``, ``return_results`` and ``get_topk`` are plain PyTorch. The faiss
helpers live in the faiss plugin (``pytorch_metric_learning_faiss.index_helpers``); the
functions here import it through the registry only when called, so importing them never
imports faiss, and calling one without the plugin raises the plugin's install hint.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Callable

import torch

from .knn import remove_self_matches
from .registry import knn_factory

__all__ = [
    "add_to_index_and_search",
    "convert_to_cpu_index",
    "convert_to_gpu_index",
    "get_topk",
    "mask_reshape_knn_idx",
    "return_results",
    "run_pca",
    "try_gpu",
]

_FAISS_HELPERS = "pytorch_metric_learning_faiss.index_helpers"


def mask_reshape_knn_idx(x: torch.Tensor, matches_self_idx: torch.Tensor) -> torch.Tensor:
    """Drop the entries of ``x`` where ``matches_self_idx`` is True, one per row.

    Example:
        >>> x = torch.tensor([[0, 4, 5], [3, 1, 6]])
        >>> mask_reshape_knn_idx(x, torch.tensor([[True, False, False], [False, True, False]]))
        tensor([[4, 5],
                [3, 6]])
    """
    return x[~matches_self_idx].view(x.shape[0], -1)


def return_results(
    D: torch.Tensor,  # noqa: N803 (the 2.x parameter names)
    I: torch.Tensor,  # noqa: N803, E741
    embeddings_come_from_same_source: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(D, I)``, without each query's own index when the query is part of the reference.

    A row that does not contain its own index loses its last neighbour instead, so every row
    keeps the same width (one less than searched).

    Example:
        >>> D = torch.tensor([[0.0, 1.0, 2.0], [0.5, 0.7, 0.9]])
        >>> I = torch.tensor([[0, 4, 5], [3, 4, 6]])
        >>> return_results(D, I, True)[1].tolist(), return_results(D, I, False)[1].shape
        ([[4, 5], [3, 4]], torch.Size([2, 3]))
    """
    if embeddings_come_from_same_source:
        return remove_self_matches(D, I)
    return D, I


def get_topk(
    distances: torch.Tensor, indices: torch.Tensor, k: int, get_largest: bool
) -> Callable[[torch.Tensor, int, int], None]:
    """A ``BatchedDistance`` ``iter_fn`` writing each block's top ``k`` into rows ``s:e``.

    Indices are columns of the block's matrix, i.e. reference row numbers.

    Example:
        >>> distances, indices = torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.long)
        >>> fill = get_topk(distances, indices, 1, get_largest=False)
        >>> fill(torch.tensor([[3.0, 1.0, 2.0]]), 1, 2)
        >>> indices.tolist(), distances.tolist()
        ([[0], [1]], [[0.0], [1.0]])
    """

    def fn(mat: torch.Tensor, s: int, e: int) -> None:
        top_distances, top_indices = torch.topk(mat, k, largest=get_largest, dim=1)
        distances[s:e] = top_distances
        indices[s:e] = top_indices

    return fn


def _faiss_helpers() -> ModuleType:
    """The plugin's helper module; without the plugin, the registry's install-hint error."""
    knn_factory("faiss")
    return importlib.import_module(_FAISS_HELPERS)


def add_to_index_and_search(
    index: Any, query: torch.Tensor, reference: torch.Tensor | None, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append ``reference`` to a faiss ``index`` (if given) and search it (faiss plugin).

    See ``pytorch_metric_learning_faiss.index_helpers.add_to_index_and_search``.
    """
    result: tuple[torch.Tensor, torch.Tensor]
    result = _faiss_helpers().add_to_index_and_search(index, query, reference, k)
    return result


def convert_to_gpu_index(index: Any, gpus: Sequence[int] | None = None) -> Any:
    """A copy of a faiss ``index`` on GPUs (faiss plugin; needs a GPU build of faiss)."""
    return _faiss_helpers().convert_to_gpu_index(index, gpus)


def convert_to_cpu_index(index: Any) -> Any:
    """A CPU copy of a faiss GPU ``index``; a CPU index as is (faiss plugin)."""
    return _faiss_helpers().convert_to_cpu_index(index)


def try_gpu(
    index: Any, query: torch.Tensor, reference: torch.Tensor | None, k: int, is_cuda: bool,
    gpus: Sequence[int] | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Add and search on GPUs when asked for and possible, else on the CPU (faiss plugin)."""
    result: tuple[torch.Tensor, torch.Tensor]
    result = _faiss_helpers().try_gpu(index, query, reference, k, is_cuda, gpus)
    return result


def run_pca(x: torch.Tensor, output_dimensionality: int) -> torch.Tensor:
    """Project rows onto their first principal components, centred, not scaled (faiss plugin)."""
    result: torch.Tensor = _faiss_helpers().run_pca(x, output_dimensionality)
    return result
