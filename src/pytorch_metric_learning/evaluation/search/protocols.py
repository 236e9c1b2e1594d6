"""The call contracts every k-NN and k-means backend follows.

Any callable of the right shape is a backend; there is no base class to inherit.
:func:`~pytorch_metric_learning.evaluation.check_knn_output` checks a k-NN backend's
answer against the contract written in :class:`KNNFunc`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["KNNFunc", "KMeansFunc", "knn_is_inverted"]


@runtime_checkable
class KNNFunc(Protocol):
    """Finds the ``k`` nearest rows of ``reference`` for each row of ``query``.

    The contract, all of which :func:`~pytorch_metric_learning.evaluation.check_knn_output`
    and ``AccuracyCalculator`` check:

    - **Inputs.** ``query`` and ``reference`` are 2-D floating-point tensors (``float16``,
      ``bfloat16``, ``float32`` or ``float64``, as the caller has them; nothing is cast
      on the way) with the same number of columns, finite, on one device. ``k`` is an int
      between 1 and ``len(reference)``, or ``len(reference) - 1`` with
      ``ref_includes_query``: a self-search may ask for every other row. ``reference=None``
      means ``query`` itself.
    - **Outputs.** ``(distances, indices)``, both shaped ``(len(query), k)`` and on the
      query's device. ``indices`` is ``torch.long`` and addresses rows of the ``reference``
      of this call, distinct within a row (never -1 padding). ``distances`` is a floating-point tensor without
      NaN, in the dtype the backend computes in (``CustomKNN``: the inputs' promoted dtype;
      faiss: ``float32``).
    - **Order.** Each row is nearest first: distances ascending, or, for a backend that
      declares ``is_inverted = True`` (an attribute of the backend, or of its ``distance``),
      similarities descending. Ties may come in any order.
    - **Self-search.** With ``ref_includes_query=True`` the query is the first
      ``len(query)`` rows of ``reference``; ``AccuracyCalculator`` passes the very same
      tensor object as both when it scores a set against itself. The backend searches
      ``k + 1`` neighbours and removes row ``i`` from row ``i``'s results, or the last
      neighbour when row ``i`` is not among them
      (:func:`~pytorch_metric_learning.evaluation.remove_self_matches` does this). No row
      may contain its own index.
    - **Determinism.** The same inputs give the same distances and indices on the same
      machine and library versions; an approximate backend seeds whatever it randomizes.
    """

    def __call__(
        self, query: torch.Tensor, k: int, reference: torch.Tensor | None = None,
        ref_includes_query: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip


@runtime_checkable
class KMeansFunc(Protocol):
    """Clusters the rows of ``x`` into ``num_clusters`` groups.

    Returns one ``torch.long`` cluster id per row, on ``x``'s device.
    """

    def __call__(self, x: torch.Tensor, num_clusters: int) -> torch.Tensor: ...


def knn_is_inverted(knn_func: Any) -> bool:
    """Whether a k-NN backend returns similarities (larger is nearer) rather than distances.

    One rule for every reader (the calculator's output check, the distributed merge): a
    bool ``is_inverted`` attribute of the backend, else that of its ``distance``, else
    False (distances, smallest first).

    Example:
        >>> from pytorch_metric_learning.distances import CosineSimilarity
        >>> from pytorch_metric_learning.evaluation import CustomKNN
        >>> knn_is_inverted(CustomKNN(CosineSimilarity())), knn_is_inverted(len)
        (True, False)
    """
    for owner in (knn_func, getattr(knn_func, "distance", None)):
        declared = getattr(owner, "is_inverted", None)
        if isinstance(declared, bool):
            return declared
    return False
