"""Search a gallery with a trained model: pytorch-metric-learning 2.x's ``InferenceModel``.

The model embeds inputs (tensors, lists of tensors or datasets); a k-NN backend finds the
nearest gallery items and a :class:`MatchFinder` decides matches at a threshold. Beyond
2.x: any registered k-NN backend by name, the exact ``custom`` backend by default (2.x
needed faiss), a k-NN order that agrees with the match finder by default, and the
model's train/eval modes restored after embedding.
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .._atomic import atomic_save_to_path
from .._validation import check_matrix, check_positive_int, invalid
from .._warnings import warn_external
from ..distances import CosineSimilarity
from ..errors import CorruptFileError, InvalidArgumentError, InvalidTypeError
from ..evaluation.search._checked_search import search_knn
from ..evaluation.search.registry import load_knn_func
from ..evaluation.verification.match_finder import MatchFinder
from ..testers.base_tester import _default_device, _eval_mode, _to_device
from . import _distance_agreement as agreement
from .checkpoints import load_state_dict, save_state_dict

__all__ = ["InferenceModel"]

logger = logging.getLogger(__name__)

_OWNER = "InferenceModel"
_REFERENCE_KEY = "reference_embeddings"
PathLike = Union[str, "os.PathLike[str]"]


class InferenceModel:
    """Embed inputs with ``embedder(trunk(x))`` and search or match them against a gallery.

    Args:
        trunk: The model (any callable; ``nn.Module`` modes are handled).
        embedder: Applied to the trunk's output; None for the identity.
        match_finder: Decides matches; default ``MatchFinder(CosineSimilarity(),
            threshold=0.9)`` as in 2.x.
        normalize_embeddings: Scale each embedding to unit length (2.x's default).
        knn_func: A k-NN backend or a backend spec (``"custom"``, ``"faiss"``,
            ``{"name": "faiss", "index": "HNSW32"}``, ...). Default: exact search that
            orders neighbours as the match finder compares them (for cosine: squared
            Euclidean distances of unit vectors, as 2.x's faiss default returned). A
            mismatch between an explicit backend and the match finder is warned about.
        data_device: Where input tensors go; None: the device of the trunk's parameters.
        dtype: Floating-point input tensors are cast to it.

    A backend with ``train``/``add`` and ``reset_before=False`` (such as
    ``FaissKNN(reset_before=False, reset_after=False)``) keeps its own index, saved with its
    ``save``/``load``. Any other backend is given the gallery embeddings that this model keeps
    (:attr:`reference_embeddings`), saved as a tensor file.

    Example:
        >>> import torch
        >>> model = InferenceModel(torch.nn.Linear(3, 2, bias=False))
        >>> with torch.no_grad():
        ...     _ = model.trunk.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
        >>> model.train_knn(torch.tensor([[1.0, 0, 5], [0, 1.0, 5], [-1.0, 0, 5]]))
        >>> distances, indices = model.get_nearest_neighbors(torch.tensor([[2.0, 0.1, 0]]), k=2)
        >>> indices.tolist()
        [[0, 1]]
        >>> model.is_match(torch.tensor([[1.0, 0, 0]]), torch.tensor([[1.0, 0.1, 0]]))
        True
    """

    def __init__(
        self,
        trunk: Any,
        embedder: Any = None,
        match_finder: MatchFinder | None = None,
        normalize_embeddings: bool = True,
        knn_func: Any = None,
        data_device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.trunk = _check_callable(trunk, "trunk")
        self.embedder = (
            torch.nn.Identity() if embedder is None else _check_callable(embedder, "embedder")
        )
        self.match_finder = _check_match_finder(match_finder)
        self.normalize_embeddings = _check_bool(normalize_embeddings, "normalize_embeddings")
        self.data_device = _check_device(data_device)
        self.dtype = _check_dtype(dtype)
        self.knn_func = self._resolve_knn(knn_func)
        self._reference: torch.Tensor | None = None

    def __repr__(self) -> str:
        return (
            f"InferenceModel(match_finder={self.match_finder!r}, knn_func={self.knn_func!r}, "
            f"normalize_embeddings={self.normalize_embeddings})"
        )

    @property
    def reference_embeddings(self) -> torch.Tensor | None:
        """The gallery embeddings searched by a backend without its own index, or None."""
        return self._reference

    # ----------------------------------------------------------------- embedding
    def get_embeddings(self, x: Any) -> torch.Tensor:
        """Embed one batch: tensors go to the data device; the models run in eval mode.

        Each submodule's train/eval mode is restored afterwards, so calling this between
        training iterations leaves training as it was.
        """
        x = self.process_if_list(x)
        if isinstance(x, torch.Tensor):
            x = _to_device(x, self._device(), self.dtype)
        with _eval_mode(self.trunk, self.embedder), torch.no_grad():
            embeddings = self.embedder(self.trunk(x))
        check_matrix(embeddings, "embedder(trunk(x)) output", _OWNER)
        if self.normalize_embeddings:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        return embeddings

    def get_embeddings_from_tensor_or_dataset(self, inputs: Any, batch_size: int) -> torch.Tensor:
        """Embed a tensor, a list, or a dataset of ``(input, label)`` items, in batches."""
        batch_size = check_positive_int(batch_size, "batch_size", _OWNER)
        inputs = self.process_if_list(inputs)
        if isinstance(inputs, (torch.Tensor, list)):
            batches: Any = (inputs[i : i + batch_size] for i in range(0, len(inputs), batch_size))
        elif isinstance(inputs, Dataset):
            batches = (_first(batch) for batch in DataLoader(inputs, batch_size=batch_size))
        else:
            expected = "a tensor, a list or a torch.utils.data.Dataset"
            raise invalid("inputs", _OWNER, expected, type(inputs).__name__, InvalidTypeError)
        embeddings = [self.get_embeddings(batch) for batch in batches]
        if not embeddings:
            raise invalid("inputs", _OWNER, "at least one input", "an empty collection")
        return torch.cat(embeddings)

    def process_if_list(self, x: Any) -> Any:
        """A list of tensors stacked into one tensor; anything else unchanged."""
        if isinstance(x, list) and x and all(isinstance(item, torch.Tensor) for item in x):
            return torch.stack(x)
        return x

    # ----------------------------------------------------------------- the gallery
    def train_knn(self, inputs: Any, batch_size: int = 64) -> None:
        """Make ``inputs`` (embedded) the gallery, replacing any previous one."""
        embeddings = self.get_embeddings_from_tensor_or_dataset(inputs, batch_size)
        if self._has_own_index():
            self.knn_func.train(embeddings)
        else:
            self._reference = embeddings

    def add_to_knn(self, inputs: Any, batch_size: int = 64) -> None:
        """Append ``inputs`` (embedded) to the gallery; their indices follow the existing ones."""
        embeddings = self.get_embeddings_from_tensor_or_dataset(inputs, batch_size)
        if self._has_own_index():
            self.knn_func.add(embeddings)
        elif self._reference is None:
            self._reference = embeddings
        else:
            _check_width(self._reference, embeddings)
            self._reference = torch.cat([self._reference, embeddings.to(self._reference)])

    def get_nearest_neighbors(self, query: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distances, indices)`` of each query's ``k`` nearest gallery items, nearest first."""
        query_emb = self.get_embeddings(query)
        if self._has_own_index():
            result: tuple[torch.Tensor, torch.Tensor] = self.knn_func(query_emb, k)
            return result
        reference = self._require_reference("search")
        # through the form and content checks every library search through a backend passes
        found, _ = search_knn(
            self.knn_func, query_emb, k, reference.to(query_emb.device), caller="InferenceModel"
        )
        return found

    def save_knn_func(self, filename: PathLike) -> None:
        """Save the gallery: the backend's own index, or the kept embeddings.

        Either way the file is written by the library's writing policy: the backend's
        ``save`` writes a temporary file that replaces ``filename`` only once complete, so
        a kill or a full disk leaves the previous file loadable; a FIFO or a device at
        ``filename`` is refused (``FileWriteError``)."""
        if self._has_own_index():
            atomic_save_to_path(filename, self.knn_func.save, "k-NN index")
        else:
            save_state_dict({_REFERENCE_KEY: self._require_reference("save")}, filename)

    def load_knn_func(self, filename: PathLike) -> None:
        """Load a gallery saved by :meth:`save_knn_func` with the same kind of backend."""
        if self._has_own_index():
            self.knn_func.load(filename)
            return
        reference = _read_reference(filename)
        if not isinstance(reference, torch.Tensor):
            raise invalid(
                "filename",
                f"{_OWNER}.load_knn_func",
                "a file written by save_knn_func",
                str(filename),
            )
        self._reference = check_matrix(reference, _REFERENCE_KEY, _OWNER).to(self._device())

    # ----------------------------------------------------------------- matching
    def get_matches(
        self,
        query: Any,
        ref: Any = None,
        threshold: float | None = None,
        return_tuples: bool = False,
    ) -> np.ndarray | list[tuple[Any, Any]]:
        """Which query/reference pairs match: a NumPy bool matrix or, with ``return_tuples``,
        a list of ``(query index, reference index)`` tuples (2.x's return values).

        ``ref=None`` matches the queries with each other.
        """
        query_emb = self.get_embeddings(query)
        ref_emb = query_emb if ref is None else self.get_embeddings(ref)
        if return_tuples:
            pairs = self.match_finder.get_match_indices(query_emb, ref_emb, threshold).cpu().numpy()
            return list(zip(pairs[:, 0], pairs[:, 1]))
        return self.match_finder.get_match_matrix(query_emb, ref_emb, threshold).cpu().numpy()

    def is_match(self, x: Any, y: Any, threshold: float | None = None) -> bool | np.ndarray:
        """Whether ``x[i]`` matches ``y[i]``: a bool for one pair, else a NumPy bool array."""
        matches = self.match_finder.is_match(
            self.get_embeddings(x), self.get_embeddings(y), threshold
        )
        if matches.numel() == 1:
            return bool(matches.item())
        return matches.cpu().numpy()

    # ----------------------------------------------------------------- internals
    def _device(self) -> torch.device:
        if self.data_device is not None:
            return self.data_device
        for model in (self.trunk, self.embedder):
            if isinstance(model, torch.nn.Module):
                parameter = next(model.parameters(), None)
                if parameter is not None:
                    return parameter.device
        return _default_device()

    def _resolve_knn(self, knn_func: Any) -> Any:
        if knn_func is None:
            return agreement.default_knn_for(self.match_finder)
        knn = load_knn_func(knn_func)
        problem = agreement.disagreement(knn, self.match_finder, self.normalize_embeddings)
        if problem is not None:
            warn_external(
                f"{_OWNER}: {problem}, so a nearest neighbour may not match while a farther "
                "one does (2.x issue #430). Give the match finder and the k-NN backend the "
                "same distance, or leave knn_func=None to derive it from the match finder."
            )
        return knn

    def _has_own_index(self) -> bool:
        knn = self.knn_func
        has_methods = all(callable(getattr(knn, name, None)) for name in ("train", "add"))
        return has_methods and getattr(knn, "reset_before", True) is False

    def _require_reference(self, action: str) -> torch.Tensor:
        if self._reference is None:
            raise InvalidArgumentError(
                f"{_OWNER} has no gallery to {action}: call train_knn(inputs) or "
                "load_knn_func(filename) first."
            )
        return self._reference


def _read_reference(filename: PathLike) -> Any:
    """The gallery tensor of a file, or None when it holds none; a damaged file is an error."""
    try:
        state = load_state_dict(filename, map_location="cpu")
    except (CorruptFileError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise InvalidArgumentError(
            f"{_OWNER}.load_knn_func cannot read {os.fspath(filename)!r}: it is not a file "
            f"written by save_knn_func, or it is damaged ({type(error).__name__}: {error})."
        ) from error
    except InvalidArgumentError:
        return None
    return state.get(_REFERENCE_KEY)


def _first(batch: Any) -> Any:
    """The input of a collated ``(input, label, ...)`` batch; a bare input as is."""
    return batch[0] if isinstance(batch, (list, tuple)) else batch


def _check_width(reference: torch.Tensor, embeddings: torch.Tensor) -> None:
    if embeddings.shape[1] != reference.shape[1]:
        raise InvalidArgumentError(
            f"The 'inputs' parameter of {_OWNER}.add_to_knn must embed to {reference.shape[1]} "
            f"dimensions like the gallery. Got {embeddings.shape[1]} instead."
        )


def _check_callable(value: Any, param: str) -> Any:
    if not callable(value):
        raise invalid(param, _OWNER, "a callable (such as an nn.Module)", value, InvalidTypeError)
    return value


def _check_match_finder(match_finder: Any) -> MatchFinder:
    if match_finder is None:
        return MatchFinder(distance=CosineSimilarity(), threshold=0.9)
    if not isinstance(match_finder, MatchFinder):
        raise invalid(
            "match_finder", _OWNER, "a MatchFinder or None", match_finder, InvalidTypeError
        )
    return match_finder


def _check_bool(value: Any, param: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(param, _OWNER, "a bool", value, InvalidTypeError)
    return bool(value)


def _check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        expected = "a torch.device, a device string such as 'cuda:0', or None"
        raise invalid("data_device", _OWNER, expected, device, InvalidArgumentError) from error


def _check_dtype(dtype: Any) -> torch.dtype | None:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise invalid("dtype", _OWNER, "a torch.dtype or None", dtype, InvalidTypeError)
    return dtype
