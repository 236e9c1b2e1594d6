"""The k-NN order: by distance, then by reference index, so ties never depend on k.

The search paths select a row's top k with tiles, groups and heaps, which leave equal
distances in whatever order they met them, and keep an arbitrary few of the references
tied at the k-th distance. A metric computed from k neighbours would then change with k
(asking for ``recall_at_8`` next to ``precision_at_1`` could flip ``precision_at_1``).
Instead every built-in backend returns exactly the first k of the order (distance, index):

- a search for one neighbour more than needed shows which rows have a tie across the k-th
  place (their k-th and (k+1)-th distances are equal); only those rows are computed again
  in full and cut exactly (:func:`first_k_of_rows`), which costs little: float data rarely
  has exact ties;
- within the k kept, rows with equal distances are reordered by index
  (:func:`order_ties`), sorting only the rows that have a tie.
"""

from __future__ import annotations

import torch

__all__ = ["first_k_of_rows", "order_ties", "tied_at_boundary"]


def order_ties(
    distances: torch.Tensor, indices: torch.Tensor, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows sorted nearest first, equal distances by increasing index.

    ``distances`` must already be sorted nearest first (as every backend returns them);
    only rows with two equal neighbouring distances are sorted again.

    Example:
        >>> d = torch.tensor([[0.5, 0.5, 0.9], [0.1, 0.2, 0.3]])
        >>> i = torch.tensor([[7, 3, 1], [4, 0, 2]])
        >>> order_ties(d, i, largest=False)[1].tolist()
        [[3, 7, 1], [4, 0, 2]]
    """
    if distances.shape[1] < 2:
        return distances, indices
    tied = distances[:, 1:] == distances[:, :-1]
    # only rows where a tied pair is out of index order are sorted
    rows = (tied & (indices[:, 1:] < indices[:, :-1])).any(dim=1).nonzero().flatten()
    if len(rows) == 0:
        return distances, indices
    # equal distances form runs; sorting (run number, index) orders each run by index and
    # keeps the runs in place, so the distances do not move
    runs = torch.zeros(len(rows), distances.shape[1], dtype=torch.long, device=indices.device)
    runs[:, 1:] = (~tied[rows]).cumsum(dim=1)
    keys = runs * _INDEX_SPAN + indices[rows]
    indices = indices.clone()
    indices[rows] = torch.sort(keys, dim=1).values - runs * _INDEX_SPAN
    return distances, indices


# Above any reference index (k-NN indices are below 2**31, see CustomKNN): run numbers
# are multiples of it in the keys of order_ties.
_INDEX_SPAN = 2**32


def tied_at_boundary(distances: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the rows whose k-th and (k+1)-th distances are equal (``k + 1`` columns).

    Example:
        >>> tied_at_boundary(torch.tensor([[0.1, 0.2, 0.2], [0.1, 0.2, 0.3]]), 2).tolist()
        [0]
    """
    if distances.shape[1] <= k:
        return torch.zeros(0, dtype=torch.long, device=distances.device)
    return (distances[:, k - 1] == distances[:, k]).nonzero().flatten()


def first_k_of_rows(
    values: torch.Tensor, k: int, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k entries of each full row in the order (value, then column), exactly.

    Entries beyond the k-th value are dropped; of those equal to it, the lowest columns are
    kept, as many as are needed. NaN is not expected (inputs are checked finite).

    Example:
        >>> first_k_of_rows(torch.tensor([[2.0, 1.0, 2.0, 2.0]]), 3, largest=False)[1].tolist()
        [[1, 0, 2]]
    """
    key = values.neg() if largest else values
    kth = torch.kthvalue(key, k, dim=1, keepdim=True).values
    before = key < kth
    at = key == kth
    room = k - before.sum(dim=1, keepdim=True)
    keep = before | (at & (at.cumsum(dim=1) <= room))
    columns = keep.nonzero()[:, 1].view(len(values), k)  # increasing columns per row
    picked = key.gather(1, columns)
    order = torch.argsort(picked, dim=1, stable=True)  # by value; equal values keep columns
    columns = columns.gather(1, order)
    return values.gather(1, columns), columns
