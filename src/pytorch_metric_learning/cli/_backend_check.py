"""Run each backend once on tiny data and check what it returns against the contract.

A listing that only imports factories calls a backend "ok" that crashes on its first call
or returns neighbours the metrics would silently misread. This check builds the backend
with its defaults and runs one search (k-NN: a plain search and a self-search) or one
clustering (k-means), then checks shapes, dtypes, index ranges, order and self-matches.
A distributed backend runs in a temporary one-process group.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..evaluation.distributed import DistributedEvaluationError

__all__ = ["knn_problem", "kmeans_problem"]

_ROWS, _REFERENCES, _DIMS, _K = 5, 12, 4, 3


def knn_problem(backend: Any) -> str:
    """Why ``backend`` breaks the k-NN contract on a tiny search, or ``""``.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> knn_problem(load_knn_func("custom"))
        ''
    """
    reference = torch.randn(_REFERENCES, _DIMS, generator=torch.Generator().manual_seed(0))
    searches = {
        "search": (reference[:_ROWS].clone(), _K, reference, False),
        "self-search": (reference, _K, reference, True),
    }
    for name, arguments in searches.items():
        try:
            result = _call(backend, arguments)
        except Exception as error:  # any failure of a third-party backend is its problem
            return f"the {name} failed: {_describe(error)}"
        problem = _knn_output_problem(result, len(arguments[0]), _is_inverted(backend), name)
        if problem:
            return f"the {name} {problem}"
    return ""


def kmeans_problem(backend: Any) -> str:
    """Why ``backend`` breaks the k-means contract on two tiny clusters, or ``""``.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_kmeans_func
        >>> kmeans_problem(load_kmeans_func("torch"))
        ''
    """
    points = torch.randn(20, _DIMS, generator=torch.Generator().manual_seed(0))
    points[10:] += 10
    try:
        labels = _call(backend, (points, 2))
    except Exception as error:  # any failure of a third-party backend is its problem
        return f"the clustering failed: {_describe(error)}"
    if not isinstance(labels, torch.Tensor):
        return f"returned {type(labels).__name__}, not a torch.Tensor of cluster ids"
    if labels.shape != (20,) or labels.dtype != torch.long:
        return f"returned {labels.dtype} of shape {tuple(labels.shape)}, not torch.long of (20,)"
    if labels.min() < 0 or labels.max() >= 2:
        return f"returned cluster ids {sorted(set(labels.tolist()))} for 2 clusters"
    return ""


def _call(backend: Any, arguments: Sequence[Any]) -> Any:
    """Call the backend; one that needs torch.distributed runs in a one-process group.

    Warnings are silenced: the data is tiny on purpose (a k-means backend would say so).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return backend(*arguments)
        except DistributedEvaluationError:
            if not dist.is_available() or dist.is_initialized():
                raise
        with _one_process_group():
            return backend(*arguments)


@contextlib.contextmanager
def _one_process_group() -> Iterator[None]:
    """A gloo group of world size 1 on a file store: no network, gone afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(f"{folder}/store", 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _knn_output_problem(result: Any, rows: int, inverted: bool, name: str) -> str:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return f"returned {type(result).__name__}, not a (distances, indices) pair"
    distances, indices = result
    if not all(isinstance(part, torch.Tensor) for part in result):
        kinds = ", ".join(type(part).__name__ for part in result)
        return f"returned ({kinds}), not two torch.Tensors"
    expected = (rows, _K)
    if distances.shape != expected or indices.shape != expected:
        hint = (
            " (k+1 columns: is the query's own row left in?)"
            if indices.shape[-1:] == (_K + 1,)
            else ""
        )
        return (
            f"returned shapes {tuple(distances.shape)} and {tuple(indices.shape)}, "
            f"not {expected}{hint}"
        )
    return _index_problem(indices, name) or _order_problem(distances, inverted)


def _index_problem(indices: torch.Tensor, name: str) -> str:
    if indices.dtype != torch.long:
        return f"returned indices of dtype {indices.dtype}, not torch.long"
    if bool((indices == -1).any()):
        return "returned -1 indices (faiss-style padding for neighbours it did not find)"
    if bool((indices < 0).any() or (indices >= _REFERENCES).any()):
        return f"returned indices outside [0, {_REFERENCES})"
    own = torch.arange(len(indices))[:, None]
    if name == "self-search" and bool((indices == own).any()):
        return "left a query's own row among its neighbours (ref_includes_query=True)"
    return ""


def _order_problem(distances: torch.Tensor, inverted: bool) -> str:
    steps = distances[:, 1:] - distances[:, :-1]
    if inverted:
        steps = -steps
    if bool((steps < -1e-5 * (1 + distances.abs().max())).any()):
        order = "largest similarity" if inverted else "smallest distance"
        return f"returned rows that are not sorted nearest first ({order} first)"
    return ""


def _is_inverted(backend: Any) -> bool:
    """Similarities (larger = nearer) as the backend or its distance declares them."""
    declared = getattr(backend, "is_inverted", None)
    if declared is None:
        declared = getattr(getattr(backend, "distance", None), "is_inverted", False)
    return bool(declared)


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
