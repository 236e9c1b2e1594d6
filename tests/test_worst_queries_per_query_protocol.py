"""``find_worst_queries(per_query=...)`` takes only values computed under its own
arguments: values of another protocol (no camera rule, single-shot expectations where
outcomes are meant, random draws where the exact expectation is meant, other junk,
distractors, excluded pairs or roles, another ``k``, other labels) are refused with a
ValueError naming ``per_query`` and what differs, instead of ranking and labelling the
queries as what they are not.

The oracle: for every kind of difference, the argument that differs (written here) must be
named, and the same arguments (in any container: list, array, tensor of another int dtype)
must give the same worst queries as computing the values afresh.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.evaluation.retrieval import PerQueryValues
from pytorch_metric_learning.worst_queries import find_worst_queries

N = 30
METRIC = "precision_at_1"


def _data():
    generator = torch.Generator().manual_seed(5)
    labels = torch.arange(N) % 5 - 1  # -1 (junk) and 0 (distractor) occur
    x = torch.randn(N, 3, generator=generator, dtype=torch.float64) + 0.5 * labels[:, None]
    cams = torch.arange(N) % 3
    return x, labels, cams


def _base():
    x, labels, cams = _data()
    return {
        "query_groups": cams,
        "junk_labels": (-1,),
        "distractor_labels": (0,),
        "excluded_pairs": torch.tensor([[1, 6], [2, 12]]),
        "single_gallery_shot": True,
    }


# kind -> (get_accuracy's protocol changes, find_worst_queries' protocol changes, named)
_, _LABELS, _CAMS = _data()
MISMATCHES = {
    "groups left out": ({"query_groups": None}, {}, "query_groups"),
    "other groups": ({"query_groups": (_CAMS + 1) % 3}, {}, "query_groups"),
    "junk": ({"junk_labels": ()}, {}, "junk_labels"),
    "distractors": ({}, {"distractor_labels": (1,)}, "distractor_labels"),
    "excluded pairs": ({"excluded_pairs": None}, {}, "excluded_pairs"),
    "other excluded pairs": ({"excluded_pairs": torch.tensor([[1, 7]])}, {}, "excluded_pairs"),
    "single shot vs plain": ({"single_gallery_shot": False}, {}, "single_gallery_shot"),
    "plain vs single shot": ({}, {"single_gallery_shot": False}, "single_gallery_shot"),
    "drawn vs expected": ({"single_gallery_shot_draws": 3}, {}, "single_gallery_shot_draws"),
    "expected vs drawn": ({}, {"single_gallery_shot_draws": 3}, "single_gallery_shot_draws"),
    "other draws": (
        {"single_gallery_shot_draws": 3},
        {"single_gallery_shot_draws": 4},
        "single_gallery_shot_draws",
    ),
    "roles": (
        {"is_query": torch.arange(N) < 20, "is_reference": torch.ones(N, dtype=torch.bool)},
        {"is_query": torch.arange(N) < 21, "is_reference": torch.ones(N, dtype=torch.bool)},
        "is_query",
    ),
    "reference role": (
        {"is_query": torch.ones(N, dtype=torch.bool), "is_reference": torch.arange(N) > 2},
        {"is_query": torch.ones(N, dtype=torch.bool), "is_reference": torch.arange(N) > 3},
        "is_reference",
    ),
}


def _per_query(calculator_k=None, labels=None, **changes):
    x, own_labels, _ = _data()
    protocol = {key: value for key, value in {**_base(), **changes}.items() if value is not None}
    calculator = AccuracyCalculator(include=(METRIC,), k=calculator_k)
    np.random.seed(0)
    found = calculator.get_accuracy(
        x, own_labels if labels is None else labels, return_per_query=True, **protocol
    )
    return found["per_query"]


def _worst(per_query, labels=None, **changes):
    x, own_labels, _ = _data()
    protocol = {key: value for key, value in {**_base(), **changes}.items() if value is not None}
    np.random.seed(0)
    return find_worst_queries(
        x,
        own_labels if labels is None else labels,
        metric=METRIC,
        num_queries=5,
        k=3,
        per_query=per_query,
        **protocol,
    )


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_values_of_another_protocol_are_refused_naming_what_differs(kind):
    theirs, ours, named = MISMATCHES[kind]
    per_query = _per_query(**theirs)
    with pytest.raises(InvalidArgumentError) as caught:
        _worst(per_query, **ours)
    message = str(caught.value)
    assert "'per_query' parameter of find_worst_queries" in message
    assert f"{named} (" in message
    assert isinstance(caught.value, ValueError)


def test_values_of_a_calculator_with_another_k_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"'per_query'.*k \(5 there, none here\)"):
        _worst(_per_query(calculator_k=5))


def test_values_of_other_labels_are_refused():
    other = _LABELS.flip(0)
    with pytest.raises(InvalidArgumentError, match=r"'per_query'.*query_labels \("):
        _worst(_per_query(labels=other))


def test_values_built_by_hand_record_nothing_and_are_refused():
    found = _per_query()
    by_hand = PerQueryValues(found.query_indices, found.query_labels, dict(found.values))
    with pytest.raises(InvalidArgumentError, match="'per_query'.*record none"):
        _worst(by_hand)


@pytest.mark.parametrize(
    "container",
    [
        lambda t: t,
        lambda t: t.to(torch.int32),
        lambda t: t.numpy(),
        lambda t: t.tolist(),
    ],
    ids=["tensor", "int32", "numpy", "list"],
)
def test_the_same_arguments_in_other_containers_are_reused(container):
    """Equal arguments are equal whatever holds them; the worst queries equal those of
    values computed afresh."""
    _, _, cams = _data()
    per_query = _per_query(query_groups=container(cams), junk_labels=[-1])
    reused = _worst(per_query, junk_labels=np.array([-1]))
    alone = _worst(None)
    assert reused == alone
    assert [item.value_kind for item in reused] == ["single_shot_expected"] * len(reused)


def test_drawn_values_with_equal_draws_are_reused():
    per_query = _per_query(single_gallery_shot_draws=3)
    reused = _worst(per_query, single_gallery_shot_draws=3)
    assert {item.value_kind for item in reused} == {"single_shot_drawn"}
    values = dict(zip(per_query.query_rows.tolist(), per_query.values[METRIC].tolist()))
    assert [item.value for item in reused] == [values[item.index] for item in reused]
