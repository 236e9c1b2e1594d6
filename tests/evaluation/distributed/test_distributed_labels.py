"""Label tables reduced across spawned ranks, against torch.unique on the concatenation."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["label_counts_1", "label_counts_2"])
def test_global_label_counts_equal_counts_of_the_concatenation(ran, name: str) -> None:
    world, cases, results = ran
    labels = cases[name]["labels"]
    dim = 0 if labels.ndim > 1 else None
    unique, counts = torch.unique(labels, sorted=True, return_counts=True, dim=dim)
    positions = []
    for rank in range(world):
        got = results[rank][name]
        assert "value" in got, got.get("traceback")
        got_unique, got_counts, got_positions = got["value"]
        assert torch.equal(got_unique, unique) and torch.equal(got_counts, counts)
        positions.append(got_positions)
    assert torch.equal(unique[torch.cat(positions)], labels)
