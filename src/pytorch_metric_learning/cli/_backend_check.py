"""Run each backend once on tiny data and check what it returns against the contract.

A listing that only imports factories calls a backend "ok" that crashes on its first call
or returns neighbours the metrics would silently misread. This check builds the backend
with its defaults and runs it: k-NN backends through
:func:`~pytorch_metric_learning.evaluation.check_knn_backend` (realistic searches and a
repeat: shapes, dtypes, index ranges, order, self-matches, determinism, and the content
spot-check: recomputed distances and exact neighbours of sampled queries), k-means backends
on two clusters (one ``torch.long`` id per row, below the number of clusters). A
distributed backend runs in a temporary one-process group.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..errors import BackendOutputError
from ..evaluation import check_knn_backend
from ..evaluation.distributed import DistributedEvaluationError
from ..evaluation.search.knn_output import CHECK_SIZE

__all__ = ["knn_problem", "kmeans_problem"]

_DIMS = 4


def knn_problem(backend: Any, size: int = CHECK_SIZE) -> str:
    """Why ``backend`` breaks the k-NN contract (form or content), or ``""``.

    The searches and checks are :func:`~pytorch_metric_learning.evaluation.check_knn_backend`'s.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> knn_problem(load_knn_func("custom"), size=200)
        ''
    """
    return knn_trial(backend, size)[0]


def knn_trial(backend: Any, size: int = CHECK_SIZE, name: str | None = None) -> tuple[str, str]:
    """``(problem, note)``: why ``backend`` breaks the contract (or ``""``), and for an
    approximate backend the recall its searches measured (else ``""``).

    Given the ``name`` it was built by, the backend is rebuilt once per distance kind
    (euclidean and cosine) when its factory takes a ``distance`` option.

    Example:
        >>> from pytorch_metric_learning.evaluation import load_knn_func
        >>> knn_trial(load_knn_func("custom"), 200, "custom")
        ('', '')
    """
    try:
        checks = _call(check_knn_backend, (backend if name is None else name,), size=size)
    except BackendOutputError as error:
        return " ".join(str(error).split()), ""
    except Exception as error:  # any failure of a third-party backend is its problem
        return f"the search failed: {_describe(error.__cause__ or error)}", ""
    approximate = [check for check in checks if not check.exact and check.recall is not None]
    if not approximate:
        return "", ""
    worst = min(approximate, key=lambda check: check.recall)
    return "", worst.describe()


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


def _call(backend: Any, arguments: Sequence[Any], **options: Any) -> Any:
    """Call the backend; one that needs torch.distributed runs in a one-process group.

    Warnings are silenced: the data is tiny on purpose (a k-means backend would say so).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return backend(*arguments, **options)
        except DistributedEvaluationError:
            if not dist.is_available() or dist.is_initialized():
                raise
        with _one_process_group():
            return backend(*arguments, **options)


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


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
