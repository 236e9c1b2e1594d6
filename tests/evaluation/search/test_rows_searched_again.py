"""Rows whose k-th neighbour the products' rounding leaves in doubt are searched again
whole: their references near the k-th listed and scored, or, when most references are
near it, whole rows scored with identical references scored once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_knn_exclusion import dense_mask, exclusion_of, problems
from test_knn_exclusion import oracle as excluding_oracle
from test_knn_ties import EXACT, PATHS, _force, oracle, tied_points

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import CustomKNN
from pytorch_metric_learning.evaluation.search import _compiled_topk, _pair_scores
from pytorch_metric_learning.evaluation.search._excluded_search import search_excluding

# listed references near the k-th, whole rows
WINDOWS = {"listed": 0, "whole": 10**9}


def every_row_in_doubt(patch: pytest.MonkeyPatch, window: str) -> None:
    """Every row searched again, its references within twice the k-th's score near it."""
    patch.setattr(_pair_scores, "ROUNDING_SLACK", 1.0)
    patch.setattr(_pair_scores, "WIDE_WINDOW", WINDOWS[window])


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    points=tied_points(),
    distance_index=st.integers(0, len(EXACT) - 1),
    path=st.sampled_from(PATHS),
    batch_size=st.one_of(st.none(), st.integers(1, 17)),
    mode=st.sampled_from(["self", "self drop", "separate"]),
    k=st.integers(1, 60),
)
def test_listed_and_whole_rows_both_give_the_first_k(
    points, distance_index, path, batch_size, mode, k
) -> None:
    if path == "compiled" and not _compiled_topk.installed():
        path = "rows"
    if path in ("compiled", "walk"):
        batch_size = None
    query = points[: max(1, len(points) // 2)] if mode == "separate" else points
    drop = mode == "self drop"
    k = min(k, len(points) - drop)
    assume(k >= 1)
    distance = EXACT[distance_index]
    expected = oracle(query.double().numpy(), points.double().numpy(), distance, k, drop)
    found = {}
    for window in WINDOWS:
        with pytest.MonkeyPatch.context() as patch:
            _force(patch, path, 32 * 32 * 4)
            every_row_in_doubt(patch, window)
            knn = CustomKNN(distance, batch_size=batch_size)
            found[window] = knn(query, k, points if mode == "separate" else None, drop)
        np.testing.assert_array_equal(found[window][1].numpy(), expected)
    assert torch.equal(found["listed"][0], found["whole"][0])


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(problem=problems(), distance_index=st.integers(0, len(EXACT) - 1))
def test_excluded_pairs_stay_out_of_whole_rows(problem, distance_index) -> None:
    """Excluded references score as the worst, after every candidate, by index."""
    query, reference, rules, k = problem
    distance = EXACT[distance_index]
    mask = dense_mask(len(query), len(reference), rules)
    expected = excluding_oracle(query, reference, distance, k, mask)
    for window in WINDOWS:
        exclusion = exclusion_of(len(query), len(reference), rules)
        with pytest.MonkeyPatch.context() as patch:
            every_row_in_doubt(patch, window)
            _, indices, valid = search_excluding(
                CustomKNN(distance), query, k, reference, exclusion
            )
        for row, want in enumerate(expected):
            assert indices[row][valid[row]].tolist() == want
            assert int(valid[row].sum()) == len(want)


def test_identical_references_are_scored_once(monkeypatch) -> None:
    """400 copies of one row: every row is in doubt and every reference is near its k-th;
    the pairs scored are the candidates' and one per query row, not 400 per row."""
    scored = []
    original = _pair_scores.PairScores._scores

    def counting(self, rows, indices):
        scored.append(indices.numel())
        return original(self, rows, indices)

    monkeypatch.setattr(_pair_scores.PairScores, "_scores", counting)
    points = torch.full((400, 6), 0.3)
    distances, indices = CustomKNN(LpDistance(normalize_embeddings=False))(points, 5, None, True)
    assert sum(scored) <= 400 * (5 + 3) + 400
    expected = [[j for j in range(6) if j != i][:5] for i in range(400)]
    assert indices.tolist() == expected
    assert bool((distances == 0).all())
