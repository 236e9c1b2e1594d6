"""Training-loop helpers with the names and behaviour of 2.x's ``common_functions``.

Re-exported by :mod:`pytorch_metric_learning.utils.common_functions` for training code
written for pytorch-metric-learning 2.x: endless iteration over a data loader, freezing
parameters or layers, weight initialisation with fixed options.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable, TypeVar

import torch
from torch.utils.data import BatchSampler, DataLoader

__all__ = [
    "TorchInitWrapper",
    "get_train_dataloader",
    "return_input",
    "set_layers_to_eval",
    "set_requires_grad",
    "try_next_on_generator",
]

T = TypeVar("T")


def try_next_on_generator(gen: Iterator[T], iterable: Iterable[T]) -> tuple[Iterator[T], T]:
    """The next item of ``gen``, starting a new pass over ``iterable`` when it is exhausted.

    Returns ``(iterator, item)``: keep the iterator for the next call.

    Example:
        >>> data = [1, 2]
        >>> it = iter(data)
        >>> items = []
        >>> for _ in range(3):
        ...     it, item = try_next_on_generator(it, data)
        ...     items.append(item)
        >>> items
        [1, 2, 1]
    """
    try:
        return gen, next(gen)
    except StopIteration:
        gen = iter(iterable)
        return gen, next(gen)


def set_requires_grad(model: torch.nn.Module, requires_grad: bool) -> None:
    """Set ``requires_grad`` on every parameter of ``model`` (False freezes it).

    Example:
        >>> layer = torch.nn.Linear(2, 2)
        >>> set_requires_grad(layer, False)
        >>> [p.requires_grad for p in layer.parameters()]
        [False, False]
    """
    for param in model.parameters():
        param.requires_grad = requires_grad


def set_layers_to_eval(layer_name: str) -> Callable[[torch.nn.Module], None]:
    """A function for ``model.apply`` that puts layers whose class name contains
    ``layer_name`` in eval mode (2.x's trainers froze batch norm with ``"BatchNorm"``).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        >>> _ = model.apply(set_layers_to_eval("BatchNorm"))
        >>> [m.training for m in model]
        [True, False]
    """

    def set_to_eval(module: torch.nn.Module) -> None:
        if layer_name in type(module).__name__:
            module.eval()

    return set_to_eval


def get_train_dataloader(
    dataset: Any,
    batch_size: int,
    sampler: Any,
    num_workers: int,
    collate_fn: Callable[..., Any] | None,
) -> DataLoader[Any]:
    """2.x's training loader: full batches only, shuffled unless a sampler is given.

    A ``BatchSampler`` is used as the loader's ``batch_sampler`` (it makes the batches).

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> loader = get_train_dataloader(TensorDataset(torch.arange(5)), 2, None, 0, None)
        >>> [len(batch[0]) for batch in loader]
        [2, 2]
    """
    if isinstance(sampler, BatchSampler):
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=False,
        )
    return DataLoader(
        dataset,
        batch_size=int(batch_size),
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        collate_fn=collate_fn,
        shuffle=sampler is None,
        pin_memory=False,
    )


def return_input(x: T) -> T:
    """Return ``x`` (2.x's default hook and label map).

    Example:
        >>> return_input(3)
        3
    """
    return x


class TorchInitWrapper:
    """An initialiser with fixed options: ``TorchInitWrapper(init_func, **kwargs)(tensor)``
    runs ``init_func(tensor, **kwargs)``.

    Example:
        >>> weight = torch.empty(2, 2)
        >>> TorchInitWrapper(torch.nn.init.constant_, val=0.5)(weight)
        >>> weight.tolist()
        [[0.5, 0.5], [0.5, 0.5]]
    """

    def __init__(self, init_func: Callable[..., Any], **kwargs: Any) -> None:
        self.init_func = init_func
        self.kwargs = kwargs

    def __call__(self, tensor: torch.Tensor) -> None:
        self.init_func(tensor, **self.kwargs)
