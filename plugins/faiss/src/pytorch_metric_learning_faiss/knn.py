"""k-nearest-neighbour search with a faiss index: exact by default, approximate by config."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Union

import faiss
import numpy as np
import torch

from pytorch_metric_learning._atomic import atomic_save_to_path
from pytorch_metric_learning._validation import check_embeddings, check_positive_int, invalid
from pytorch_metric_learning.distances import BaseDistance, DotProductSimilarity, LpDistance
from pytorch_metric_learning.errors import (
    BackendRuntimeError,
    InvalidArgumentError,
    InvalidTypeError,
)
from pytorch_metric_learning.evaluation.search._rescale import largest_magnitude
from pytorch_metric_learning.evaluation.search._ties import order_ties, tied_at_boundary
from pytorch_metric_learning.evaluation.search.knn import (
    check_search_inputs,
    check_search_k,
    remove_self_matches,
)

from . import _gpu
from ._interop import LOGGER_PREFIX, faiss_errors, from_numpy, to_float32_numpy
from .errors import IndexFileNotFoundError

__all__ = ["FaissKNN"]

logger = logging.getLogger(f"{LOGGER_PREFIX}.knn")

_OWNER = "FaissKNN"
# Embeddings whose largest magnitude is below this (about 8.7e-19) have squared distances
# within 2**6 of float32's smallest normal number: they underflow, and neighbours tie.
SMALLEST_MAGNITUDE = 2.0**-60
IndexInitFn = Callable[[int], Any]
PathLike = Union[str, "os.PathLike[str]"]


class FaissKNN:
    """k-NN search with a faiss index, following the ``KNNFunc`` contract.

    Args:
        reset_before: Build a new index from ``index_init_fn(dimension)`` on every call and
            add the call's ``reference`` before searching. If False, a call searches the
            existing index, appending a ``reference`` passed to it first (its rows are
            numbered after those already present).
        reset_after: Discard the index after every call.
        index_init_fn: Callable returning a faiss index for a dimension. Defaults to
            ``faiss.IndexFlatL2`` (exact search, squared Euclidean distances).
        gpus: A non-empty list or tuple of faiss GPU ids to search on. Without it, CUDA
            queries use every GPU visible to faiss. Ignored by faiss-cpu.
        index: A faiss index factory string such as ``"IVF1024,Flat"`` or ``"HNSW32"``,
            instead of ``index_init_fn``. An index that needs training is trained on the
            first rows added to it. The string is kept as :attr:`index_string`; the
            attribute :attr:`index` is the live faiss index, as in 2.x.
        nprobe: Inverted lists an IVF index visits per query (more: slower, more exact).
        efSearch: Candidate list size of an HNSW index (more: slower, more exact).

    Example:
        >>> import torch
        >>> query = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
        >>> reference = torch.tensor([[0.0, 1.0], [3.0, 0.5], [9.0, 9.0]])
        >>> distances, indices = FaissKNN()(query, 1, reference)
        >>> indices.tolist(), distances.tolist()
        ([[0], [1]], [[1.0], [0.25]])
    """

    def __init__(
        self,
        reset_before: bool = True,
        reset_after: bool = True,
        index_init_fn: IndexInitFn | None = None,
        gpus: list[int] | tuple[int, ...] | None = None,
        *,
        index: str | None = None,
        nprobe: int | None = None,
        efSearch: int | None = None,  # noqa: N803 (faiss's own parameter name)
    ) -> None:
        self.reset_before = _check_bool(reset_before, "reset_before")
        self.reset_after = _check_bool(reset_after, "reset_after")
        self.index_init_fn = _check_index_init_fn(index_init_fn, index)
        self.index_string = index
        self.gpus = _check_gpus(gpus)
        self.nprobe = None if nprobe is None else check_positive_int(nprobe, "nprobe", _OWNER)
        self.efSearch = (
            None if efSearch is None else check_positive_int(efSearch, "efSearch", _OWNER)
        )
        self._index: Any = None
        self._inverted = False
        self._exact = _string_is_exact(index)
        self._resources = _gpu.GpuResources(lambda: faiss.StandardGpuResources())
        self._warned_cpu_only = False

    def __repr__(self) -> str:
        options = [
            f"reset_before={self.reset_before}",
            f"reset_after={self.reset_after}",
            f"index_init_fn={self.index_init_fn!r}",
            f"gpus={self.gpus!r}",
        ]
        for name in ("index_string", "nprobe", "efSearch"):
            value = getattr(self, name)
            if value is not None:
                options.append(f"{'index' if name == 'index_string' else name}={value!r}")
        return f"FaissKNN({', '.join(options)})"

    @property
    def is_exact(self) -> bool:
        """Whether the index compares every row (a flat index), so its neighbours are exact.

        False for an approximate factory string (``"HNSW32"``, ``"IVF1024,Flat"``, a
        ``PCA`` or quantizing index ...): the library then reports the recall it measures
        on a sample instead of calling a missed neighbour an error. The live index decides
        when there is one, else the index built last, else the factory string.

        Example:
            >>> FaissKNN().is_exact, FaissKNN(index="Flat").is_exact, FaissKNN(index="HNSW32").is_exact
            (True, True, False)
        """
        if self._index is not None:
            return _index_is_flat(self._index)
        return self._exact

    @property
    def is_inverted(self) -> bool:
        """Whether the index ranks by inner product, so that larger values are nearer.

        The live index's metric, else that of the index built last (the default
        ``reset_after=True`` discards it after each call). ``faiss.IndexFlatIP`` and other
        inner-product indexes return similarities, largest first; the k-NN contract reads
        this declaration to check and merge their order.
        """
        if self._index is not None:
            return bool(self._index.metric_type == faiss.METRIC_INNER_PRODUCT)
        return self._inverted

    @property
    def index(self) -> Any:
        """The live faiss index, or None when there is none (as in 2.x, it can be set).

        Setting it replaces the index that calls with ``reset_before=False`` search, e.g.
        ``knn.index = faiss.IndexFlatIP(dim)``; ``nprobe``/``efSearch`` are applied to it.
        The constructor's factory string is kept in :attr:`index_string`.

        Example:
            >>> import faiss, torch
            >>> knn = FaissKNN(reset_before=False, reset_after=False)
            >>> knn.index is None
            True
            >>> knn.index = faiss.IndexFlatIP(2)
            >>> knn.add(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
            >>> knn.index.ntotal
            2
        """
        return self._index

    @index.setter
    def index(self, index: Any) -> None:
        if index is not None and not isinstance(index, faiss.Index):
            raise invalid("index", _OWNER, "a faiss.Index or None", index, InvalidTypeError)
        self._index = index
        if index is not None:
            self._apply_search_params()

    @property
    def distance(self) -> BaseDistance | None:
        """The distance the index ranks by, as a distance object; None when it cannot be told.

        Squared Euclidean for the default and factory-string indices (and any L2 index),
        the raw dot product for an inner-product index; None for an ``index_init_fn``
        that has not built an index yet or an index with another metric.

        Example:
            >>> FaissKNN().distance
            LpDistance(normalize_embeddings=False, p=2, power=2, is_inverted=False)
        """
        if self._index is not None:
            return _distance_of_metric(self._index.metric_type)
        if self.index_init_fn is None:
            return _distance_of_metric(faiss.METRIC_L2)
        return None

    @property
    def faiss_index(self) -> Any:
        """The same as :attr:`index`."""
        return self._index

    @torch.no_grad()
    def __call__(
        self, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Return ``(distances, indices)`` of the ``k`` nearest indexed rows, nearest first.

        Without ``reference`` the persistent index is searched (``reset_before=False``).
        """
        search_k = self._validate_call(query, k, reference, ref_includes_query)
        if self.reset_before:
            self.reset()
        try:
            if reference is not None:
                self._ensure_index(reference.shape[1])
                self._place(reference.device, search_k)
                self._append(reference)
            else:
                self._place(query.device, search_k)
            distances, indices = self._search(query, search_k + self._extra(search_k))
            if ref_includes_query:
                distances, indices = remove_self_matches(distances, indices)
            distances, indices = order_ties(distances, indices, self.is_inverted)
            tied = tied_at_boundary(distances, k)
            if len(tied):
                distances, indices = distances.clone(), indices.clone()
                distances[tied, :k], indices[tied, :k] = self._whole_ties(
                    query, tied, k, ref_includes_query
                )
        finally:
            if self.reset_after:
                self.reset()
        return distances[:, :k], indices[:, :k]

    def _extra(self, search_k: int) -> int:
        """1 to search one neighbour more, which shows the rows with a tie across the k-th
        place; 0 when there is none, or when it would push a GPU search to the CPU."""
        index = self._require_index("search")
        if search_k >= index.ntotal:
            return 0
        on_gpu = bool(_gpu.index_gpus(index, faiss))
        return 0 if on_gpu and not _gpu.k_fits_gpu(search_k + 1) else 1

    def _whole_ties(
        self, query: torch.Tensor, rows: torch.Tensor, k: int, drop_self: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k neighbours of the query ``rows`` by (distance, index): searched for
        twice as many until every reference tied at the k-th distance is in."""
        total = self._require_index("search").ntotal
        wanted = min(2 * (k + drop_self + 1), total)
        while True:
            distances, indices = self._search(query[rows], wanted)
            if drop_self:  # the query row's own index, when present
                own = indices == rows.to(indices.device).unsqueeze(1)
                key = distances.masked_fill(own, -torch.inf if self.is_inverted else torch.inf)
                order = torch.argsort(own.to(torch.int8), dim=1, stable=True)
                distances, indices = key.gather(1, order), indices.gather(1, order)
                distances, indices = distances[:, :-1], indices[:, :-1]
            beyond = distances[:, -1] != distances[:, k - 1]
            if wanted == total or bool(beyond.all()):
                distances, indices = order_ties(distances, indices, self.is_inverted)
                return distances[:, :k], indices[:, :k]
            wanted = min(2 * wanted, total)

    def train(self, reference: torch.Tensor | np.ndarray) -> None:
        """Replace the index with a new one holding ``reference`` (trained on it if needed).

        ``reference`` is a tensor or, as 2.x accepted, a NumPy array.
        """
        reference = check_embeddings(_from_array(reference), "reference", _OWNER)
        self.reset()
        self.add(reference)

    def add(self, reference: torch.Tensor | np.ndarray) -> None:
        """Append rows to the index (a new one if there is none); their indices continue."""
        reference = check_embeddings(_from_array(reference), "reference", _OWNER)
        _check_magnitude({"reference": reference})
        self._ensure_index(reference.shape[1])
        self._place(reference.device, None)
        self._append(reference)

    def reset(self) -> None:
        """Discard the index. GPU resources are kept for the next index."""
        self._index = None

    def save(self, path: PathLike) -> None:
        """Write the index to ``path`` (a CPU copy of a GPU index) with ``faiss.write_index``.

        The file is written by the library's writing policy: into a temporary file that
        replaces ``path`` only once complete, so a kill or a full disk during the save
        leaves the previous index loadable; a FIFO or a device at ``path`` is refused. A
        missing folder is created, as :meth:`InferenceModel.save_knn_func` does.

        Raises:
            FileWriteError: the file could not be written, or its folder cannot be created
                (names ``path``).
        """
        path = _check_path(path, "save")
        index = self._require_index("save")
        with faiss_errors(_OWNER, f"save the index to {path!r}"):
            if _gpu.index_gpus(index, faiss):
                index = faiss.index_gpu_to_cpu(index)

        def write(temp_name: str) -> None:
            with faiss_errors(_OWNER, f"save the index to {path!r}"):
                faiss.write_index(index, temp_name)

        atomic_save_to_path(path, write, "faiss index")

    def load(self, path: PathLike) -> None:
        """Replace the index with one read from ``path`` (written by :meth:`save`)."""
        path = _check_path(path, "load")
        try:
            index = faiss.read_index(path)
        except RuntimeError as error:
            if not os.path.isfile(path):
                raise IndexFileNotFoundError(
                    f"{_OWNER} cannot load {path!r}: there is no such file."
                ) from error
            raise BackendRuntimeError(
                f"{_OWNER} cannot load {path!r}: it is not a faiss index file, or it is "
                f"damaged or truncated (faiss reported: {str(error).strip()}). "
                "Write index files with FaissKNN.save or faiss.write_index."
            ) from error
        self._index = index
        self._apply_search_params()

    def _validate_call(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None,
        ref_includes_query: bool,
    ) -> int:
        """Check everything before the index changes; return the number of neighbours to find."""
        check_embeddings(query, "query", _OWNER)
        if reference is None and self.reset_before:
            raise InvalidArgumentError(
                f"The 'reference' parameter of {_OWNER} must be a tensor when reset_before=True, "
                "since every call builds a new index from it. Got None instead; pass a "
                "reference, or use FaissKNN(reset_before=False) with train(), add() or load() "
                "to search a persistent index."
            )
        existing = None if self.reset_before else self._index
        if reference is not None:
            check_search_inputs(query, reference, _OWNER)
            _check_magnitude({"query": query, "reference": reference})
        elif existing is None:
            raise InvalidArgumentError(
                f"{_OWNER} has no index to search: pass a reference, or call train(), add() "
                "or load() first."
            )
        if existing is not None:
            _check_dimension(existing, query.shape[1], "query")
        total = (0 if existing is None else existing.ntotal) + (
            0 if reference is None else len(reference)
        )
        return check_search_k(k, total, ref_includes_query, _OWNER)

    def _ensure_index(self, dimension: int) -> None:
        if self._index is None:
            self._index = self._new_index(dimension)
            self._apply_search_params()
        else:
            _check_dimension(self._index, dimension, "reference")

    def _new_index(self, dimension: int) -> Any:
        if self.index_string is not None:
            try:
                index = faiss.index_factory(dimension, self.index_string)
            except RuntimeError as error:
                raise invalid(
                    "index",
                    _OWNER,
                    f"a faiss index factory string (such as 'IVF1024,Flat' or 'HNSW32') "
                    f"valid for {dimension}-dimensional vectors",
                    self.index_string,
                ) from error
        else:
            index = (self.index_init_fn or faiss.IndexFlatL2)(dimension)
        if not isinstance(index, faiss.Index):
            raise invalid("index_init_fn", _OWNER, "a callable returning a faiss.Index", index)
        _check_dimension(index, dimension, "reference")
        self._inverted = index.metric_type == faiss.METRIC_INNER_PRODUCT
        self._exact = _index_is_flat(index)
        return index

    def _apply_search_params(self) -> None:
        given = {"nprobe": self.nprobe, "efSearch": self.efSearch}
        params = {name: value for name, value in given.items() if value is not None}
        if not params:
            return
        on_gpu = bool(_gpu.index_gpus(self._index, faiss))
        space = faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()
        for name, value in params.items():
            try:
                space.set_index_parameter(self._index, name, value)
            except RuntimeError as error:
                raise InvalidArgumentError(
                    f"The '{name}' parameter of {_OWNER} does not apply to a "
                    f"{type(self._index).__name__} index ('nprobe' is for IVF indices, "
                    f"'efSearch' for HNSW). Got {name}={value!r}."
                ) from error

    def _plan(self, device: torch.device) -> tuple[int, ...]:
        env = _gpu.gpu_environment(faiss)
        if self.gpus is not None and not env.gpu_build and not self._warned_cpu_only:
            self._warned_cpu_only = True
            logger.warning(
                "FaissKNN(gpus=%s): this faiss has no GPU support (faiss-cpu); searching on "
                "the CPU. Install a GPU build of faiss to search on GPUs.",
                list(self.gpus),
            )
        if self.gpus is not None and env.num_gpus and max(self.gpus) >= env.num_gpus:
            raise invalid(
                "gpus",
                _OWNER,
                f"GPU ids visible to faiss (0 to {env.num_gpus - 1})",
                list(self.gpus),
            )
        return _gpu.plan_gpus(env, device, self.gpus)

    def _place(self, device: torch.device, k: int | None) -> None:
        """Move a CPU index to the planned GPUs, unless ``k`` is beyond the GPU limit."""
        plan = self._plan(device)
        if not plan or _gpu.index_gpus(self._index, faiss):
            return
        if k is not None and not _gpu.k_fits_gpu(k):
            _warn_k_too_large(k)
            return
        with faiss_errors(_OWNER, f"copy the index to GPUs {list(plan)}"):
            self._index = _gpu.index_to_gpus(self._index, plan, self._resources, faiss)
        self._apply_search_params()

    def _append(self, reference: torch.Tensor) -> None:
        index = self._index
        devices = _gpu.index_gpus(index, faiss)
        action = f"add {len(reference)} rows to the index (training it first if it needs it)"
        with faiss_errors(_OWNER, action):
            if _gpu.zero_copy(devices, reference.device):
                resources = self._resources.get(devices[0])
                _gpu.add_on_device(index, reference, resources, faiss)
                return
            data = to_float32_numpy(reference)
            if not index.is_trained:
                index.train(data)
            index.add(data)

    def _search(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = self._index
        devices = _gpu.index_gpus(index, faiss)
        if devices and not _gpu.k_fits_gpu(k):
            _warn_k_too_large(k)
            with faiss_errors(_OWNER, "copy the index to the CPU"):
                index, devices = faiss.index_gpu_to_cpu(index), ()
        with faiss_errors(_OWNER, f"search {len(query)} queries for {k} neighbours"):
            if _gpu.zero_copy(devices, query.device):
                resources = self._resources.get(devices[0])
                distances, indices = _gpu.search_on_device(index, query, k, resources, faiss)
            else:
                found = index.search(to_float32_numpy(query), k)
                distances = from_numpy(found[0], torch.float32, query.device)
                indices = from_numpy(found[1], torch.long, query.device)
        _check_all_found(indices, k, exact=_is_flat(index))
        return distances, indices

    def _require_index(self, action: str) -> Any:
        if self._index is None:
            raise InvalidArgumentError(
                f"{_OWNER} has no index to {action}: pass a reference to a call, or call "
                "train(), add() or load() first."
            )
        return self._index


_FLAT_STRINGS = {"Flat"}
_FLAT_CLASSES = {
    "IndexFlat",
    "IndexFlatL2",
    "IndexFlatIP",
    "GpuIndexFlat",
    "GpuIndexFlatL2",
    "GpuIndexFlatIP",
}


def _string_is_exact(index: str | None) -> bool:
    """A factory string is exact when it names a flat index and nothing that transforms it."""
    return index is None or index.replace(" ", "") in _FLAT_STRINGS


def _index_is_flat(index: Any) -> bool:
    inner = faiss.downcast_index(index)
    if type(inner).__name__.startswith("IndexIDMap"):
        inner = faiss.downcast_index(getattr(inner, "index"))  # noqa: B009 (swig attribute)
    return type(inner).__name__ in _FLAT_CLASSES


def _distance_of_metric(metric_type: int) -> BaseDistance | None:
    if metric_type == faiss.METRIC_L2:
        return LpDistance(normalize_embeddings=False, power=2)
    if metric_type == faiss.METRIC_INNER_PRODUCT:
        return DotProductSimilarity(normalize_embeddings=False)
    return None


def _from_array(x: Any) -> Any:
    """A NumPy array as a tensor (2.x's ``train``/``add`` took arrays); anything else as is."""
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _warn_k_too_large(k: int) -> None:
    logger.warning(
        "FaissKNN: k=%d is more than the %d neighbours a faiss GPU search returns; "
        "searching the CPU index instead.",
        k,
        _gpu.GPU_MAX_K,
    )


def _check_all_found(indices: torch.Tensor, k: int, exact: bool = False) -> None:
    """faiss pads missing neighbours with -1; never hand those out as row numbers."""
    missing = (indices < 0).any(dim=1)
    if bool(missing.any()):
        found = f"faiss found fewer than {k} neighbours for {int(missing.sum())} of {len(indices)} queries"
        if exact:  # a flat index compares every row: only non-finite distances go missing
            raise BackendRuntimeError(
                f"{found}: their squared distances overflow float32 (embeddings of magnitude "
                "about 1e19 or more). Scale the embeddings down (a power of two is exact), "
                "or use CustomKNN, which rescales them itself."
            )
        raise BackendRuntimeError(
            f"{found}: an approximate index searched too little of itself. "
            "Raise nprobe (IVF) or efSearch (HNSW), or ask for fewer neighbours."
        )


def _check_magnitude(embeddings: dict[str, torch.Tensor]) -> None:
    """Refuse embeddings (all of them together) too small for float32 squared distances.

    A query alone may be that small: its distances are then the references' squared norms.
    """
    largest = largest_magnitude(*embeddings.values())
    if 0.0 < largest < SMALLEST_MAGNITUDE:
        names = " and ".join(f"'{name}'" for name in embeddings)
        noun = "parameters" if len(embeddings) > 1 else "parameter"
        raise InvalidArgumentError(
            f"The {names} {noun} of {_OWNER} must hold embeddings of magnitude above about "
            f"1e-18. Got a largest magnitude of {largest:.1e}: their squared distances "
            "underflow float32, so faiss would rank ties. Scale the embeddings up (a power of "
            "two is exact), or use CustomKNN, which rescales them itself."
        )


def _is_flat(index: Any) -> bool:
    """Whether ``index`` is an exact flat index (CPU or GPU), which misses no neighbour."""
    flat = tuple(
        cls
        for cls in (getattr(faiss, "IndexFlat", None), getattr(faiss, "GpuIndexFlat", None))
        if cls
    )
    try:
        return isinstance(faiss.downcast_index(index), flat)
    except Exception:  # an index type downcast_index does not know is not a flat one
        return False


def _check_dimension(index: Any, dimension: int, name: str) -> None:
    if index.d != dimension:
        raise InvalidArgumentError(
            f"The '{name}' parameter of {_OWNER} must have as many columns as the index "
            f"({index.d}). Got {dimension} columns instead."
        )


def _check_bool(value: Any, param: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(param, _OWNER, "a bool", value, InvalidTypeError)
    return bool(value)


def _check_index_init_fn(
    index_init_fn: IndexInitFn | None, index: str | None
) -> IndexInitFn | None:
    if index_init_fn is not None and not callable(index_init_fn):
        raise invalid(
            "index_init_fn", _OWNER, "a callable or None", index_init_fn, InvalidTypeError
        )
    if index is not None and (not isinstance(index, str) or not index.strip()):
        raise invalid(
            "index", _OWNER, "a faiss index factory string or None", index, InvalidTypeError
        )
    if index is not None and index_init_fn is not None:
        raise InvalidArgumentError(
            f"{_OWNER} takes either 'index_init_fn' or 'index', not both. "
            f"Got index_init_fn={index_init_fn!r} and index={index!r}."
        )
    return index_init_fn


def _check_gpus(gpus: Any) -> tuple[int, ...] | None:
    if gpus is None:
        return None
    if not isinstance(gpus, (list, tuple)):
        raise invalid("gpus", _OWNER, "a list or tuple of GPU ids, or None", gpus, InvalidTypeError)
    if not gpus:
        raise invalid("gpus", _OWNER, "a non-empty list or tuple of GPU ids, or None", gpus)
    for gpu in gpus:
        if isinstance(gpu, bool) or not isinstance(gpu, (int, np.integer)):
            raise invalid("gpus", _OWNER, "a list or tuple of int GPU ids", gpus, InvalidTypeError)
    if min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise invalid("gpus", _OWNER, "distinct non-negative GPU ids", gpus)
    return tuple(int(gpu) for gpu in gpus)


def _check_path(path: Any, action: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise invalid("path", f"{_OWNER}.{action}", "a str or os.PathLike", path, InvalidTypeError)
    return os.fspath(path)
