"""k-means clustering with ``faiss.Kmeans``, following the ``KMeansFunc`` contract."""

from __future__ import annotations

from typing import Any

import faiss
import torch

from pytorch_metric_learning._validation import check_embeddings, check_positive_int
from pytorch_metric_learning._warnings import warn_external
from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation.search._rescale import in_float_range, largest_magnitude

from ._interop import faiss_errors, from_numpy, to_float32_numpy

__all__ = ["FaissKMeans"]

_OWNER = "FaissKMeans"
# Given per call (the data's width and num_clusters), never as options.
_PER_CALL = ("d", "k")
# faiss's own default: fewer points per centroid make it print a raw "WARNING clustering"
# line on the process's output; the check is ours instead, as a Python warning.
_MIN_POINTS_PER_CENTROID = 39


class FaissKMeans:
    """k-means with faiss: trains on a float32 CPU copy of the data.

    Args:
        **kwargs: Options of ``faiss.Kmeans`` (fields of ``faiss.ClusteringParameters``),
            such as ``niter=20``, ``nredo=1``, ``spherical=False``, ``verbose=False`` and
            ``seed=1234``, the random seed: the same seed and data give the same clusters.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
        >>> labels = FaissKMeans(seed=0)(x, 2)
        >>> labels[0] == labels[1], labels[0] != labels[2], labels.dtype
        (tensor(True), tensor(True), torch.int64)
    """

    def __init__(self, **kwargs: Any) -> None:
        _check_options(kwargs)
        self.kwargs = kwargs

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={value!r}" for name, value in self.kwargs.items())
        return f"FaissKMeans({options})"

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, num_clusters: int) -> torch.Tensor:
        """Cluster the rows of ``x``; return one ``torch.long`` cluster id per row on x's device."""
        check_embeddings(x, "x", _OWNER)
        num_clusters = check_positive_int(num_clusters, "num_clusters", _OWNER)
        if num_clusters > len(x):
            raise InvalidArgumentError(
                f"The 'num_clusters' parameter of {_OWNER} must be at most the number of rows "
                f"of x ({len(x)}). Got {num_clusters} instead."
            )
        _warn_if_few_points(len(x), num_clusters, self.kwargs)
        # faiss aborts the process on squared distances that overflow float32: rescale
        # by a power of two, which changes no cluster (and saves those that underflow).
        data = to_float32_numpy(in_float_range(x, largest_magnitude(x)))
        options = {**self.kwargs, "min_points_per_centroid": 1}  # silence faiss's own print
        with faiss_errors(_OWNER, f"cluster {len(x)} rows into {num_clusters} clusters"):
            kmeans = faiss.Kmeans(data.shape[1], num_clusters, **options)
            kmeans.train(data)
            _, labels = kmeans.index.search(data, 1)
        return from_numpy(labels[:, 0], torch.long, x.device)


def _warn_if_few_points(rows: int, num_clusters: int, kwargs: dict[str, Any]) -> None:
    """Warn (through Python's warnings) where faiss would print its raw warning."""
    minimum = int(kwargs.get("min_points_per_centroid", _MIN_POINTS_PER_CENTROID))
    if rows < minimum * num_clusters:
        warn_external(
            f"{_OWNER}: clustering {rows} points into {num_clusters} clusters leaves fewer "
            f"than {minimum} points per cluster (faiss asks for at least "
            f"{minimum * num_clusters}). The centroids are rough and depend on the seed, so "
            "NMI and AMI from these clusters can vary between runs; the k-NN metrics are "
            "not affected."
        )


def _check_options(kwargs: dict[str, Any]) -> None:
    """Reject options that faiss.Kmeans would refuse, before any data is clustered."""
    given_per_call = sorted(set(kwargs) & set(_PER_CALL))
    if given_per_call:
        raise InvalidArgumentError(
            f"{_OWNER} takes the dimension and the number of clusters from each call, so "
            f"{given_per_call} cannot be options. Call kmeans(x, num_clusters) instead."
        )
    try:
        faiss.Kmeans(1, 1, **kwargs)
    except AttributeError as error:
        known = sorted(name for name in dir(faiss.ClusteringParameters()) if _is_field(name))
        raise InvalidArgumentError(
            f"{_OWNER} got an option that faiss.Kmeans does not know ({error}). "
            f"Known options: {known} and 'gpu'."
        ) from error
    except TypeError as error:
        raise InvalidTypeError(f"{_OWNER} got an option of the wrong type: {error}") from error


def _is_field(name: str) -> bool:
    return not name.startswith("_") and name not in {"this", "thisown"}
