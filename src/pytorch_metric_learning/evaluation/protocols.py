"""The call contracts every k-NN and k-means backend follows.

Any callable of the right shape is a backend; there is no base class to inherit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["KNNFunc", "KMeansFunc"]


@runtime_checkable
class KNNFunc(Protocol):
    """Finds the ``k`` nearest rows of ``reference`` for each row of ``query``.

    Returns ``(distances, indices)``, each shaped ``(len(query), k)``, on the query's
    device, nearest first. When ``ref_includes_query`` is true the query is the first
    ``len(query)`` rows of the reference, and each query's own row is left out: the
    backend searches ``k + 1`` neighbours and removes row ``i`` from row ``i``'s results,
    or the last neighbour when row ``i`` is not among them.
    """

    def __call__(
        self,
        query: torch.Tensor,
        k: int,
        reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class KMeansFunc(Protocol):
    """Clusters the rows of ``x`` into ``num_clusters`` groups.

    Returns one ``torch.long`` cluster id per row, on ``x``'s device.
    """

    def __call__(self, x: torch.Tensor, num_clusters: int) -> torch.Tensor: ...
