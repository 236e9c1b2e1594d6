"""DistributedKNN pieces that need no second process: merging, layout, arguments."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import CustomKNN, list_knn_backends, load_knn_func
from pytorch_metric_learning.evaluation.distributed import (
    DistributedEvaluationError,
    DistributedKNN,
    merge_top_k,
)
from pytorch_metric_learning.evaluation.distributed._collectives import resolve_timeout
from pytorch_metric_learning.evaluation.distributed._layout import ShardLayout


@given(
    values=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    largest=st.booleans(),
    data=st.data(),
)
def test_merge_top_k_orders_by_distance_then_index(values, largest, data) -> None:
    indices = data.draw(st.permutations(list(range(len(values)))))
    k = data.draw(st.integers(1, len(values)))
    expected = sorted(
        zip(values, indices), key=lambda pair: (-pair[0] if largest else pair[0], pair[1])
    )[:k]
    got_d, got_i = merge_top_k(
        torch.tensor([values], dtype=torch.float32), torch.tensor([indices]), k, largest
    )
    assert got_d[0].tolist() == [float(v) for v, _ in expected]
    assert got_i[0].tolist() == [i for _, i in expected]


def test_layout_without_self_is_the_plain_concatenation() -> None:
    layout = ShardLayout((2, 0, 1), (3, 0, 4), ref_includes_query=False)
    assert [layout.reference_ids(r).tolist() for r in range(3)] == [[0, 1, 2], [], [3, 4, 5, 6]]
    assert layout.reference_order().tolist() == list(range(7))


def test_layout_with_self_puts_every_query_first() -> None:
    # rank 0: query rows q0 q1, then rest r0; rank 1: nothing; rank 2: query q2, rest r1 r2 r3
    layout = ShardLayout((2, 0, 1), (3, 0, 4), ref_includes_query=True)
    ids = [layout.reference_ids(r).tolist() for r in range(3)]
    assert ids == [[0, 1, 3], [], [2, 4, 5, 6]]
    plain = ["q0", "q1", "r0", "q2", "r1", "r2", "r3"]
    assert [plain[i] for i in layout.reference_order()] == [
        "q0",
        "q1",
        "q2",
        "r0",
        "r1",
        "r2",
        "r3",
    ]


def test_layout_blocks_cover_each_shard_once() -> None:
    layout = ShardLayout((5, 0, 9), (5, 0, 9), ref_includes_query=False)
    steps = layout.num_steps(4)
    assert steps == 3
    assert [layout.block_counts(s, 4) for s in range(steps)] == [[4, 0, 4], [1, 0, 4], [0, 0, 1]]
    assert ShardLayout((0, 0), (1, 1), False).num_steps(4) == 0


def test_registered_as_torch_distributed() -> None:
    assert "torch_distributed" in list_knn_backends()
    knn = load_knn_func(
        {"name": "torch_distributed", "knn_func": {"name": "custom", "distance": "cosine"}}
    )
    assert isinstance(knn, DistributedKNN)
    assert knn.is_inverted is True
    assert isinstance(knn.local, CustomKNN)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"block_size": 0}, InvalidArgumentError),
        ({"block_size": 2.5}, InvalidTypeError),
        ({"timeout": 0}, InvalidArgumentError),
        ({"timeout": "10"}, InvalidArgumentError),
        ({"is_inverted": 1}, InvalidArgumentError),
        ({"knn_func": 3}, InvalidTypeError),
    ],
)
def test_invalid_options(options, error) -> None:
    with pytest.raises(error):
        DistributedKNN(**options)


def test_timeouts_accept_seconds_and_timedeltas() -> None:
    assert resolve_timeout(2, "X") == timedelta(seconds=2)
    assert resolve_timeout(timedelta(minutes=1), "X") == timedelta(seconds=60)
    assert resolve_timeout(None, "X") is None


def test_without_a_process_group_the_error_says_what_to_do() -> None:
    assert not dist.is_initialized()
    with pytest.raises(DistributedEvaluationError, match="init_process_group"):
        DistributedKNN()(torch.zeros(2, 3), 1)


@pytest.mark.parametrize("ref_includes_query", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_rank_equals_custom_knn(one_rank_group, ref_includes_query, dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(11, 4, generator=generator, dtype=dtype)
    reference = torch.cat([query, torch.randn(6, 4, generator=generator, dtype=dtype)])
    knn = CustomKNN(LpDistance(normalize_embeddings=False, power=2))
    expected = knn(query, 5, reference, ref_includes_query)
    got = DistributedKNN(knn, block_size=4)(query, 5, reference, ref_includes_query)
    assert got[0].dtype == expected[0].dtype
    assert torch.equal(got[1], expected[1])
    torch.testing.assert_close(got[0], expected[0])


def test_one_rank_invalid_input_raises_its_own_error(one_rank_group) -> None:
    with pytest.raises(InvalidArgumentError, match="first rows of its reference shard"):
        DistributedKNN()(torch.zeros(3, 2), 1, torch.zeros(2, 2), True)
    with pytest.raises(InvalidTypeError, match="'query' parameter of DistributedKNN"):
        DistributedKNN()([[0.0]], 1)


def test_one_rank_local_backend_with_wrong_shape_is_reported(one_rank_group) -> None:
    def bad(query, k, reference=None, ref_includes_query=False):
        return torch.zeros(len(query), k + 1), torch.zeros(len(query), k + 1, dtype=torch.long)

    with pytest.raises(RuntimeError, match="returned shapes"):
        DistributedKNN(bad)(torch.zeros(3, 2), 1)


def test_one_rank_search_with_labels_returns_the_neighbours_labels(one_rank_group) -> None:
    generator = torch.Generator().manual_seed(8)
    query = torch.randn(9, 3, generator=generator)
    labels = torch.randint(4, (9, 2, 2), generator=generator)
    _, indices, got = DistributedKNN(block_size=4).search_with_labels(query, 3, None, labels, True)
    assert torch.equal(got, labels[indices])


@pytest.mark.parametrize(
    ("labels", "error"),
    [
        (torch.zeros(4, dtype=torch.long), InvalidArgumentError),
        (torch.zeros(5, dtype=torch.bool), InvalidArgumentError),
        ([0, 1, 2, 3, 4], InvalidTypeError),
    ],
)
def test_one_rank_rejects_bad_reference_labels(one_rank_group, labels, error) -> None:
    with pytest.raises(error, match="reference_labels"):
        DistributedKNN().search_with_labels(torch.zeros(5, 2), 1, None, labels)


@pytest.mark.parametrize("name", ["knn", "kmeans", "accuracy", "_labels"])
def test_docstring_examples(name: str) -> None:
    import doctest
    import importlib

    module = importlib.import_module(f"pytorch_metric_learning.evaluation.distributed.{name}")
    outcome = doctest.testmod(module, raise_on_error=False)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_label_tables_of_no_labels_are_empty(one_rank_group) -> None:
    from pytorch_metric_learning.evaluation.distributed._collectives import resolve_comm
    from pytorch_metric_learning.evaluation.distributed._labels import global_label_counts

    comm = resolve_comm(None, None, torch.device("cpu"))
    unique, counts = global_label_counts(comm, torch.zeros(0, 2, dtype=torch.long), "test")
    assert unique.shape == (0, 2) and counts.shape == (0,)


def test_one_rank_with_no_queries_returns_empty_results(one_rank_group) -> None:
    distances, indices = DistributedKNN()(torch.zeros(0, 3), 2, torch.randn(4, 3))
    assert distances.shape == indices.shape == (0, 2)
