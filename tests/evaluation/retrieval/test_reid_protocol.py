"""The re-identification protocol, one set in two roles, and explicit excluded pairs.

The oracle is the protocol written out plainly per query, from its definition: sort the
gallery by (distance, index), drop the same-identity same-camera images and the junk,
mark the relevant ones (same identity, not a distractor); a query with none is left out;
CMC@K = any relevant in the first K, AP = mean over relevant items of the precision at
their rank, INP = R / rank of the last relevant item.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _camera_sets import camera_sets, evaluate_camera_set
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator, cmc_curve

METRICS = (
    "precision_at_1",
    "recall_at_1",
    "recall_at_5",
    "recall_at_10",
    "mean_average_precision",
    "mean_inverse_negative_penalty",
)


def distance_matrix(query: torch.Tensor, gallery: torch.Tensor) -> np.ndarray:
    q, g = query.double().numpy(), gallery.double().numpy()
    return ((q[:, None, :] - g[None, :, :]) ** 2).sum(-1)


def reid_oracle(
    distances,
    query_ids,
    gallery_ids,
    query_cams,
    gallery_cams,
    max_rank,
    junk=(),
    distractors=(),
    excluded=(),
):
    """Market-1501-style evaluation of a distance matrix, one query at a time."""
    excluded = set(map(tuple, excluded))
    cmc, aps, inps, left_out = [], [], [], 0
    for q in range(len(distances)):
        order = sorted(range(distances.shape[1]), key=lambda j: (distances[q, j], j))
        kept = [
            j
            for j in order
            if not (gallery_ids[j] == query_ids[q] and gallery_cams[j] == query_cams[q])
            and gallery_ids[j] not in junk
            and (q, j) not in excluded
        ]
        relevant = np.array(
            [gallery_ids[j] == query_ids[q] and gallery_ids[j] not in distractors for j in kept]
        )
        if not relevant.any():
            left_out += 1
            continue
        hits = np.cumsum(relevant)
        cmc.append(
            [float(hits[: r + 1][-1] > 0) if r < len(hits) else 1.0 for r in range(max_rank)]
        )
        aps.append(float(np.sum(hits / np.arange(1, len(hits) + 1) * relevant) / relevant.sum()))
        inps.append(relevant.sum() / (np.nonzero(relevant)[0].max() + 1))
    return np.mean(cmc, axis=0), np.mean(aps), np.mean(inps), left_out


@settings(max_examples=60, deadline=None)
@given(data=camera_sets())
def test_market1501_protocol_equals_the_plain_oracle(data) -> None:
    query, gallery, (query_ids, gallery_ids), (query_cams, gallery_cams) = data
    result, calculator = evaluate_camera_set(data, METRICS)
    cmc, mean_ap, minp, left_out = reid_oracle(
        distance_matrix(query, gallery),
        query_ids.tolist(),
        gallery_ids.tolist(),
        query_cams.tolist(),
        gallery_cams.tolist(),
        10,
        junk=(-1,),
        distractors=(0,),
    )
    assert calculator.last_num_queries_left_out == left_out
    if left_out == len(query):
        assert np.isnan(result["mean_average_precision"])
        return
    assert result["recall_at_1"] == pytest.approx(cmc[0], abs=1e-12)
    assert result["precision_at_1"] == pytest.approx(cmc[0], abs=1e-12)
    assert result["recall_at_5"] == pytest.approx(cmc[4], abs=1e-12)
    assert result["recall_at_10"] == pytest.approx(cmc[9], abs=1e-12)
    assert result["mean_average_precision"] == pytest.approx(mean_ap, abs=1e-12)
    assert result["mean_inverse_negative_penalty"] == pytest.approx(minp, abs=1e-12)
    max_rank = min(10, len(gallery))
    curve = cmc_curve(result["per_query"], max_rank).numpy()
    np.testing.assert_allclose(curve, cmc[:max_rank], atol=1e-12)
    np.testing.assert_allclose(result["per_query"].cmc_curve(max_rank).numpy(), curve)


def test_worked_example_by_hand() -> None:
    """One query, camera 0; gallery along a line: [same id cam 0 (junk by camera), other id,
    same id cam 1, junk label -1, distractor 0, same id cam 2]."""
    query = torch.tensor([[0.0]])
    gallery = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])
    gallery_ids = torch.tensor([7, 8, 7, -1, 0, 7])
    gallery_cams = torch.tensor([0, 1, 1, 1, 1, 2])
    calculator = AccuracyCalculator(include=METRICS, k=None)
    result = calculator.get_accuracy(
        query,
        torch.tensor([7]),
        gallery,
        gallery_ids,
        query_groups=torch.tensor([0]),
        reference_groups=gallery_cams,
        junk_labels=[-1],
        distractor_labels=[0],
    )
    # candidates in order: 8 (rank 1), 7 (rank 2), 0 (rank 3), 7 (rank 4); R = 2
    assert result["recall_at_1"] == 0.0 and result["recall_at_5"] == 1.0
    assert result["mean_average_precision"] == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert result["mean_inverse_negative_penalty"] == pytest.approx(2 / 4)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(data=camera_sets(), data_pairs=st.data())
def test_excluding_a_pair_changes_only_its_query(data, data_pairs) -> None:
    query, gallery, (query_ids, gallery_ids), (query_cams, gallery_cams) = data
    pair = [
        data_pairs.draw(st.integers(0, len(query) - 1)),
        data_pairs.draw(st.integers(0, len(gallery) - 1)),
    ]
    calculator = AccuracyCalculator(include=METRICS, k=None)
    common = {
        "query_groups": query_cams,
        "reference_groups": gallery_cams,
        "return_per_query": True,
    }
    before = calculator.get_accuracy(query, query_ids, gallery, gallery_ids, **common)["per_query"]
    after = calculator.get_accuracy(
        query, query_ids, gallery, gallery_ids, excluded_pairs=torch.tensor([pair]), **common
    )["per_query"]
    for name in METRICS:
        old = dict(zip(before.query_indices.tolist(), before.values[name].tolist()))
        new = dict(zip(after.query_indices.tolist(), after.values[name].tolist()))
        for row in set(old) | set(new):
            if row != pair[0]:
                assert old[row] == new[row]
    cmc, mean_ap, _, _ = reid_oracle(
        distance_matrix(query, gallery),
        query_ids.tolist(),
        gallery_ids.tolist(),
        query_cams.tolist(),
        gallery_cams.tolist(),
        1,
        excluded=[pair],
    )
    if len(after):
        assert after.values["mean_average_precision"].mean().item() == pytest.approx(mean_ap)


@settings(max_examples=40, deadline=None)
@given(data=camera_sets())
def test_excluding_nothing_equals_todays_results(data) -> None:
    query, gallery, (query_ids, gallery_ids), _ = data
    calculator = AccuracyCalculator(
        include=METRICS + ("r_precision", "mean_average_precision_at_r"), k=None
    )
    plain = calculator.get_accuracy(query, query_ids, gallery, gallery_ids)
    empty = torch.zeros((0, 2), dtype=torch.long)
    excluded = calculator.get_accuracy(query, query_ids, gallery, gallery_ids, excluded_pairs=empty)
    assert plain.keys() == excluded.keys()
    for name, value in plain.items():
        assert value == excluded[name] or (np.isnan(value) and np.isnan(excluded[name]))


@settings(max_examples=40, deadline=None)
@given(data=camera_sets(), flags=st.data())
def test_one_set_two_roles_equals_the_oracle(data, flags) -> None:
    """Rows flagged query and/or reference; an item that is both never retrieves itself;
    the same camera rule applies within the one set."""
    points, _, (labels, _), (cameras, _) = data
    num = len(points)
    is_query = torch.tensor(flags.draw(st.lists(st.booleans(), min_size=num, max_size=num)))
    is_reference = torch.tensor(flags.draw(st.lists(st.booleans(), min_size=num, max_size=num)))
    if not bool(is_query.any()) or not bool(is_reference.any()):
        return
    use_groups = flags.draw(st.booleans())
    calculator = AccuracyCalculator(include=METRICS, k=None)
    result = calculator.get_accuracy(
        points,
        labels,
        is_query=is_query,
        is_reference=is_reference,
        query_groups=cameras if use_groups else None,
    )
    queries = is_query.nonzero().flatten().tolist()
    references = is_reference.nonzero().flatten().tolist()
    all_distances = distance_matrix(points, points)
    distances = all_distances[np.ix_(queries, references)]
    own = [(qi, ri) for qi, q in enumerate(queries) for ri, r in enumerate(references) if q == r]
    groups = cameras if use_groups else torch.arange(num) + 1000  # distinct: no camera rule
    cmc, mean_ap, minp, left_out = reid_oracle(
        distances,
        labels[queries].tolist(),
        labels[references].tolist(),
        groups[queries].tolist(),
        groups[references].tolist() if use_groups else (-torch.ones(len(references))).tolist(),
        1,
        excluded=own,
    )
    assert calculator.last_num_queries_left_out == left_out
    if left_out < len(queries):
        assert result["recall_at_1"] == pytest.approx(cmc[0])
        assert result["mean_average_precision"] == pytest.approx(mean_ap)
        assert result["mean_inverse_negative_penalty"] == pytest.approx(minp)


def test_reference_none_with_groups_uses_the_query_groups_for_both() -> None:
    points = torch.tensor([[0.0], [0.1], [0.3], [0.2]])
    labels = torch.tensor([1, 1, 1, 2])
    cameras = torch.tensor([0, 0, 1, 0])
    calculator = AccuracyCalculator(include=("mean_average_precision",), k=None)
    result = calculator.get_accuracy(points, labels, query_groups=cameras)
    # rows 0 and 1 (camera 0) have one relevant item, row 2, ranked after row 3 (the other
    # identity): AP 1/2; row 2 ranks row 3, then rows 1 and 0: AP (1/2 + 2/3) / 2; row 3
    # has no relevant item and is left out
    assert calculator.last_num_queries_left_out == 1
    assert result["mean_average_precision"] == pytest.approx((0.5 + 0.5 + 7 / 12) / 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query_groups": torch.tensor([0, 1])}, "'reference_groups'.*both or neither"),
        (
            {"query_groups": torch.tensor([0.5, 1.0]), "reference_groups": torch.tensor([0, 1, 2])},
            "'query_groups'.*integer tensor with one group id per row \\(2\\)",
        ),
        (
            {"query_groups": torch.tensor([0, 1]), "reference_groups": torch.tensor([0, 1])},
            "'reference_groups'.*one group id per row \\(3\\)",
        ),
        ({"junk_labels": [1], "distractor_labels": [1]}, "must not share labels"),
        ({"junk_labels": "x"}, "'junk_labels'.*sequence of labels"),
        ({"is_query": torch.tensor([True, False])}, "'is_query' and 'is_reference'.*one set"),
    ],
)
def test_bad_protocol_arguments_are_named(kwargs, message) -> None:
    calculator = AccuracyCalculator(include=("precision_at_1",))
    with pytest.raises((InvalidArgumentError, TypeError), match=message):
        calculator.get_accuracy(
            torch.zeros(2, 1),
            torch.tensor([0, 1]),
            torch.zeros(3, 1),
            torch.tensor([0, 1, 1]),
            **kwargs,
        )


def test_roles_need_both_flags_with_one_per_row() -> None:
    calculator = AccuracyCalculator(include=("precision_at_1",))
    with pytest.raises(
        InvalidArgumentError, match="'is_reference'.*one flag per embedding \\(2\\)"
    ):
        calculator.get_accuracy(
            torch.zeros(2, 1),
            torch.tensor([0, 0]),
            is_query=torch.tensor([True, True]),
            is_reference=None,
        )


def test_cmc_curve_refuses_ranks_beyond_the_search() -> None:
    calculator = AccuracyCalculator(include=("recall_at_2",))
    points = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    labels = torch.tensor([0, 1, 1, 0])
    result = calculator.get_accuracy(points, labels, return_per_query=True)
    with pytest.raises(InvalidArgumentError, match="'max_rank'.*at most the 2 neighbours"):
        cmc_curve(result["per_query"], 3)
