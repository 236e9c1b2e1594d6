"""GlobalTwoStreamEmbeddingSpaceTester: anchors are the query, positives the reference."""

from __future__ import annotations

import pytest
import torch
from tester_helpers import SpyCalculator, embed_by_hand, make_model, quiet
from torch.utils.data import Dataset, TensorDataset

from pytorch_metric_learning.errors import InvalidArgumentError
from pytorch_metric_learning.testers import GlobalTwoStreamEmbeddingSpaceTester


def pairs(num: int = 7, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    anchors = torch.randn(num, 5, generator=generator)
    positives = anchors + 0.1 * torch.randn(num, 5, generator=generator)
    labels = torch.randint(0, 3, (num,), generator=generator) + 2**40  # beyond float precision
    return TensorDataset(anchors, positives, labels)


def make_tester(spy, **options) -> GlobalTwoStreamEmbeddingSpaceTester:
    return GlobalTwoStreamEmbeddingSpaceTester(accuracy_calculator=spy, **quiet(**options))


def test_anchors_are_the_query_and_positives_the_reference(spy) -> None:
    data, model = pairs(), make_model()
    accuracies = make_tester(spy, batch_size=3).test({"val": data}, 2, model)
    anchors, positives, labels = data.tensors
    (call,) = spy.calls
    torch.testing.assert_close(call["query"], embed_by_hand(model, anchors))
    torch.testing.assert_close(call["reference"], embed_by_hand(model, positives))
    assert call["ref_includes_query"] is False
    assert torch.equal(call["query_labels"], labels) and torch.equal(
        call["reference_labels"], labels
    )
    assert accuracies == {
        "val": {"epoch": 2, "precision_at_1_level0": 0.5, "r_precision_level0": 0.25}
    }


def test_integer_labels_stay_integers(spy) -> None:
    make_tester(spy).test({"val": pairs()}, 1, make_model())
    assert spy.calls[0]["query_labels"].dtype == torch.int64


def test_each_split_queries_itself_by_default(spy) -> None:
    accuracies = make_tester(spy).test({"a": pairs(4, 1), "b": pairs(6, 2)}, 1, make_model())
    assert list(accuracies) == ["a", "b"]
    assert [len(call["query"]) for call in spy.calls] == [4, 6]
    assert [len(call["reference"]) for call in spy.calls] == [4, 6]


def test_explicit_self_pairs_are_accepted(spy) -> None:
    make_tester(spy).test({"a": pairs()}, 1, make_model(), splits_to_eval=[("a", ["a"])])
    assert len(spy.calls) == 1


@pytest.mark.parametrize("references", [["b"], ["a", "b"]])
def test_other_combinations_are_an_error(spy, references) -> None:
    with pytest.raises(InvalidArgumentError, match=r"against itself.*\('a', \["):
        make_tester(spy).test(
            {"a": pairs(), "b": pairs()}, 1, make_model(), splits_to_eval=[("a", references)]
        )


def test_set_reference_and_query_refuses_other_splits(spy) -> None:
    tester = make_tester(spy)
    stored = {
        "a": (torch.zeros(4, 2), torch.zeros(2, 1)),
        "b": (torch.zeros(4, 2), torch.zeros(2, 1)),
    }
    with pytest.raises(InvalidArgumentError, match="against itself"):
        tester.set_reference_and_query(stored, "a", ["b"])


def test_models_are_in_eval_mode_and_restored(spy) -> None:
    modes = []

    class Trunk(torch.nn.Linear):
        def forward(self, x):
            modes.append(self.training)
            return super().forward(x)

    torch.manual_seed(0)
    trunk = Trunk(5, 4)
    trunk.train()
    make_tester(spy).test({"val": pairs()}, 1, trunk)
    assert modes and not any(modes)
    assert trunk.training


def test_stored_embeddings_are_anchors_then_positives(spy) -> None:
    data, model = pairs(5), make_model()
    embeddings, labels = make_tester(spy, batch_size=2).get_all_embeddings(data, model)
    anchors, positives, raw_labels = data.tensors
    expected = torch.cat([embed_by_hand(model, anchors), embed_by_hand(model, positives)])
    torch.testing.assert_close(embeddings, expected)
    assert torch.equal(labels[:, 0], raw_labels)


def test_pca_is_fitted_on_the_positives(spy) -> None:
    make_tester(spy, pca=2).test({"val": pairs(12)}, 1, make_model())
    (call,) = spy.calls
    assert call["query"].shape == (12, 2) and call["reference"].shape == (12, 2)
    # standardized on the reference: the projected reference is centred before normalization
    tester = make_tester(SpyCalculator(), pca=2, normalize_embeddings=False)
    tester.test({"val": pairs(12)}, 1, make_model())
    reference = tester.accuracy_calculator.calls[0]["reference"]
    torch.testing.assert_close(reference.mean(0), torch.zeros(2), atol=1e-5, rtol=0)


def test_items_that_are_not_triples_are_an_error(spy) -> None:
    class Pairs(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return torch.randn(5), 1

    with pytest.raises(InvalidArgumentError, match=r"split 'val'.*\(anchor, positive, label\)"):
        make_tester(spy).test({"val": Pairs()}, 1, make_model())


def test_data_and_label_getter_returns_the_triple(spy) -> None:
    data = pairs()
    anchors, positives, labels = data.tensors
    items = TensorDataset(labels, anchors, positives)  # a different item order
    tester = make_tester(spy, data_and_label_getter=lambda batch: (batch[1], batch[2], batch[0]))
    model = make_model()
    tester.test({"val": items}, 1, model)
    torch.testing.assert_close(spy.calls[0]["query"], embed_by_hand(model, anchors))
