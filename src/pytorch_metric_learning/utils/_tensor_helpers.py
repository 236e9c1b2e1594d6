"""Small tensor and array helpers with the names and behaviour of 2.x's ``common_functions``.

Re-exported by :mod:`pytorch_metric_learning.utils.common_functions` for code written for
pytorch-metric-learning 2.x; new code rarely needs them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._validation import invalid

__all__ = [
    "is_list_or_tuple",
    "numpy_to_torch",
    "to_numpy",
    "torch_all_from_dim_to_end",
    "torch_standard_scaler",
    "to_dtype",
    "to_device",
    "check_shapes",
    "use_cuda_if_available",
    "pos_inf",
    "neg_inf",
    "small_val",
    "torch_arange_from_size",
    "set_ref_emb",
]


def is_list_or_tuple(x: Any) -> bool:
    """Whether ``x`` is a list or a tuple.

    Example:
        >>> is_list_or_tuple((1, 2)), is_list_or_tuple("ab")
        (True, False)
    """
    return isinstance(x, (list, tuple))


def numpy_to_torch(v: Any) -> Any:
    """A NumPy array as a tensor sharing its memory; anything else unchanged.

    Example:
        >>> numpy_to_torch(np.array([1, 2]))
        tensor([1, 2])
        >>> numpy_to_torch([1, 2])
        [1, 2]
    """
    return torch.from_numpy(v) if isinstance(v, np.ndarray) else v


def to_numpy(v: Any) -> Any:
    """A tensor as a NumPy array (detached, on the CPU); anything else unchanged.

    Example:
        >>> to_numpy(torch.tensor([1.0], requires_grad=True))
        array([1.], dtype=float32)
    """
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


def torch_all_from_dim_to_end(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``all`` over every dimension from ``dim`` on (rows of labels that match entirely).

    Example:
        >>> torch_all_from_dim_to_end(torch.tensor([[[1, 1], [1, 0]]]).bool(), 1)
        tensor([False])
    """
    return torch.all(x.reshape(*x.shape[:dim], -1), dim=-1)


def torch_standard_scaler(x: torch.Tensor) -> torch.Tensor:
    """Each column minus its mean, divided by its (unbiased) standard deviation.

    Example:
        >>> torch_standard_scaler(torch.tensor([[1.0], [3.0]]))
        tensor([[-0.7071],
                [ 0.7071]])
    """
    return (x - torch.mean(x, dim=0)) / torch.std(x, dim=0)


def to_dtype(
    x: torch.Tensor, tensor: torch.Tensor | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x`` cast to ``dtype`` (or to ``tensor``'s dtype); unchanged under autocast.

    Example:
        >>> to_dtype(torch.tensor([1, 2]), dtype=torch.float64)
        tensor([1., 2.], dtype=torch.float64)
    """
    if torch.is_autocast_enabled(x.device.type):
        return x
    target = dtype if dtype is not None else _reference(tensor, "dtype", "to_dtype").dtype
    return x if x.dtype == target else x.type(target)


def to_device(
    x: torch.Tensor,
    tensor: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x`` moved to ``device`` (or to ``tensor``'s device), then cast to ``dtype`` if given.

    Example:
        >>> to_device(torch.tensor([1]), device="cpu", dtype=torch.float32)
        tensor([1.])
    """
    target = device if device is not None else _reference(tensor, "device", "to_device").device
    if x.device != torch.device(target):
        x = x.to(target)
    return x if dtype is None else to_dtype(x, dtype=dtype)


def check_shapes(embeddings: torch.Tensor, labels: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless ``labels`` is ``None`` or 1-D with one label per row.

    Example:
        >>> check_shapes(torch.zeros(3, 2), torch.tensor([0, 1, 1]))
    """
    if labels is None:
        return
    if embeddings.shape[0] != labels.shape[0]:
        raise invalid(
            "labels",
            "check_shapes",
            f"one label per embedding ({embeddings.shape[0]})",
            f"{labels.shape[0]} labels",
        )
    if labels.ndim != 1:
        raise invalid(
            "labels", "check_shapes", "a 1-D tensor of shape (batch_size,)", tuple(labels.shape)
        )


def use_cuda_if_available() -> torch.device:
    """``cuda`` when PyTorch sees a GPU, else ``cpu``.

    Example:
        >>> use_cuda_if_available().type in ("cuda", "cpu")
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pos_inf(dtype: torch.dtype) -> float:
    """The largest finite value of a floating ``dtype`` (2.x's stand-in for +inf).

    Example:
        >>> pos_inf(torch.float16)
        65504.0
    """
    return torch.finfo(dtype).max


def neg_inf(dtype: torch.dtype) -> float:
    """The most negative finite value of a floating ``dtype``.

    Example:
        >>> neg_inf(torch.float16)
        -65504.0
    """
    return torch.finfo(dtype).min


def small_val(dtype: torch.dtype) -> float:
    """The smallest positive normal value of a floating ``dtype``.

    Example:
        >>> small_val(torch.float32) > 0
        True
    """
    return torch.finfo(dtype).tiny


def torch_arange_from_size(input: torch.Tensor, size_dim: int = 0) -> torch.Tensor:
    """``torch.arange(input.size(size_dim))`` on ``input``'s device.

    Example:
        >>> torch_arange_from_size(torch.zeros(3, 2)).tolist()
        [0, 1, 2]
    """
    return torch.arange(input.size(size_dim), device=input.device)


def set_ref_emb(
    embeddings: torch.Tensor,
    labels: torch.Tensor | None,
    ref_emb: torch.Tensor | None,
    ref_labels: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference set: ``(ref_emb, ref_labels)``, or the queries themselves when
    ``ref_emb`` is None; reference labels are moved to ``ref_emb``'s device and checked.

    Example:
        >>> emb, labels = torch.zeros(2, 3), torch.tensor([0, 1])
        >>> set_ref_emb(emb, labels, None, None)[1].tolist()
        [0, 1]
    """
    if ref_emb is None:
        ref_emb, ref_labels = embeddings, labels
    elif ref_labels is not None:
        ref_labels = to_device(ref_labels, ref_emb)
    check_shapes(ref_emb, ref_labels)
    return ref_emb, ref_labels


def _reference(tensor: torch.Tensor | None, what: str, owner: str) -> torch.Tensor:
    if tensor is None:
        raise invalid("tensor", owner, f"a tensor whose {what} to use when {what}=None", None)
    return tensor
