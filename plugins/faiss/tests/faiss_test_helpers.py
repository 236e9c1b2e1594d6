"""Independent oracles shared by the faiss plugin's tests."""

from __future__ import annotations

import torch


def brute_force_knn(
    query: torch.Tensor, reference: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared Euclidean k-NN in float64 with a plain loop over the queries."""
    distances, indices = [], []
    for row in query.double():
        squared = ((reference.double() - row) ** 2).sum(dim=1)
        order = sorted(range(len(reference)), key=lambda j: float(squared[j]))[:k]
        indices.append(order)
        distances.append([float(squared[j]) for j in order])
    return torch.tensor(distances, dtype=torch.float64), torch.tensor(indices, dtype=torch.long)


def has_clear_gaps(query: torch.Tensor, reference: torch.Tensor, k: int, gap: float) -> bool:
    """Whether each query's k + 1 nearest squared distances differ pairwise by more than gap."""
    distances, _ = brute_force_knn(query, reference, min(k + 1, len(reference)))
    return bool((distances.diff(dim=1) > gap).all())
