"""The forward pass: get_all_embeddings, model modes, devices, dtypes, labels, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler
from tester_helpers import (
    CountingDataset,
    SpyCalculator,
    embed_by_hand,
    make_model,
    make_split,
    quiet,
)
from torch.utils.data import Dataset, TensorDataset

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester


def make_tester(**options) -> GlobalEmbeddingSpaceTester:
    options.setdefault("accuracy_calculator", SpyCalculator())
    return GlobalEmbeddingSpaceTester(**quiet(**options))


class Recorder(torch.nn.Module):
    """A linear layer that records how it was called."""

    def __init__(self, dims_in: int = 5, dims_out: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(dims_in, dims_out)
        self.calls: list[dict] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(
            {
                "training": self.training,
                "grad": torch.is_grad_enabled(),
                "dtype": x.dtype,
                "rows": len(x),
                "device": x.device,
            }
        )
        return self.linear(x)


class ListDataset(Dataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


@pytest.fixture
def split() -> TensorDataset:
    return make_split(9)


def test_embeddings_equal_the_model_output_normalized(split) -> None:
    model = make_model()
    embeddings, labels = make_tester(batch_size=4).get_all_embeddings(split, model)
    torch.testing.assert_close(embeddings, embed_by_hand(model, split.tensors[0]))
    assert torch.equal(labels, split.tensors[1].reshape(-1, 1))


def test_without_normalization_the_raw_output(split) -> None:
    model = make_model()
    embeddings, _ = make_tester(normalize_embeddings=False).get_all_embeddings(split, model)
    torch.testing.assert_close(embeddings, embed_by_hand(model, split.tensors[0], normalize=False))


def test_embedder_is_applied_to_the_trunk_output(split) -> None:
    trunk, embedder = make_model(5, 4, seed=1), make_model(4, 2, seed=2)
    embeddings, _ = make_tester().get_all_embeddings(split, trunk, embedder)
    with torch.no_grad():
        expected = torch.nn.functional.normalize(embedder(trunk(split.tensors[0])), dim=1)
    torch.testing.assert_close(embeddings, expected)


def test_use_trunk_output_skips_the_embedder(split) -> None:
    trunk, embedder = make_model(5, 4, seed=1), make_model(4, 2, seed=2)
    embeddings, _ = make_tester(use_trunk_output=True).get_all_embeddings(split, trunk, embedder)
    torch.testing.assert_close(embeddings, embed_by_hand(trunk, split.tensors[0]))


def test_batches_have_batch_size_rows(split) -> None:
    model = Recorder()
    make_tester(batch_size=4).get_all_embeddings(split, model)
    assert [call["rows"] for call in model.calls] == [4, 4, 1]


def test_models_run_in_eval_mode_without_gradients_and_modes_are_restored(split) -> None:
    trunk, embedder = Recorder(), Recorder(4, 3)
    trunk.train()
    embedder.eval()
    embeddings, _ = make_tester().get_all_embeddings(split, trunk, embedder)
    assert all(not c["training"] and not c["grad"] for c in trunk.calls + embedder.calls)
    assert trunk.training and trunk.linear.training
    assert not embedder.training
    assert not embeddings.requires_grad


def test_mixed_submodule_modes_are_restored_exactly(split) -> None:
    trunk = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    trunk.train()
    trunk[1].eval()  # a frozen batch norm inside a training model
    make_tester().get_all_embeddings(split, trunk)
    assert trunk.training and trunk[0].training and not trunk[1].training


def test_modes_are_restored_when_the_forward_pass_fails(split) -> None:
    trunk = make_model()
    trunk.train()

    def broken(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_tester().test({"val": split}, 1, trunk, broken)
    assert trunk.training


def test_dtype_casts_the_inputs_of_the_forward_pass(split) -> None:
    model = Recorder().half()
    embeddings, _ = make_tester(dtype=torch.float16).get_all_embeddings(split, model)
    assert {call["dtype"] for call in model.calls} == {torch.float16}
    assert embeddings.dtype == torch.float16
    expected = embed_by_hand(model.linear, split.tensors[0].half()).float()
    torch.testing.assert_close(embeddings.float(), expected, atol=2e-3, rtol=0)


def test_inputs_go_to_data_device(split) -> None:
    model = Recorder()
    make_tester(data_device="cpu").get_all_embeddings(split, model)
    assert {call["device"] for call in model.calls} == {torch.device("cpu")}


def test_embeddings_device_is_where_embeddings_are_stored(split) -> None:
    embeddings, labels = make_tester(embeddings_device="meta").get_all_embeddings(
        split, make_model()
    )
    assert embeddings.device.type == "meta" and labels.device.type == "meta"
    assert embeddings.shape == (9, 4)


def test_one_preallocated_tensor_per_split(split, monkeypatch) -> None:
    def no_concatenation(*args, **kwargs):
        raise AssertionError("embeddings must not be concatenated from batches")

    monkeypatch.setattr(torch, "cat", no_concatenation)
    embeddings, _ = make_tester(batch_size=2).get_all_embeddings(split, make_model())
    assert embeddings.untyped_storage().nbytes() == 9 * 4 * embeddings.element_size()


def test_default_dataloader_workers(split) -> None:
    model = make_model()
    embeddings, _ = make_tester(dataloader_num_workers=2).get_all_embeddings(split, model)
    torch.testing.assert_close(embeddings, embed_by_hand(model, split.tensors[0]))


def test_progress_bar_can_be_turned_off(split, capsys) -> None:
    make_tester(progress_bar=True).get_all_embeddings(split, make_model())
    assert "Embedding dataset" in capsys.readouterr().err
    make_tester(progress_bar=False).get_all_embeddings(split, make_model())
    assert capsys.readouterr().err == ""


def test_data_and_label_getter_reads_custom_items(split) -> None:
    data, labels = split.tensors
    items = ListDataset([{"x": x, "y": y} for x, y in zip(data, labels)])
    model = make_model()
    getter = make_tester(data_and_label_getter=lambda batch: (batch["x"], batch["y"]))
    embeddings, got_labels = getter.get_all_embeddings(items, model)
    torch.testing.assert_close(embeddings, embed_by_hand(model, data))
    assert torch.equal(got_labels[:, 0], labels)


def test_collate_fn_is_used(split) -> None:
    calls = []

    def collate(items):
        calls.append(len(items))
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    make_tester(batch_size=5).get_all_embeddings(split, make_model(), collate_fn=collate)
    assert calls == [5, 4]


def test_2d_integer_labels_keep_their_columns() -> None:
    data = torch.randn(6, 5)
    labels = torch.tensor([[0, 10], [1, 10], [2, 11], [0, 11], [1, 12], [2, 12]])
    _, got = make_tester(batch_size=4).get_all_embeddings(TensorDataset(data, labels), make_model())
    assert torch.equal(got, labels)


def test_label_tuples_per_item_become_columns() -> None:
    items = ListDataset([(torch.randn(5), (i % 3, 100 + i)) for i in range(5)])
    _, got = make_tester(batch_size=2).get_all_embeddings(items, make_model())
    assert got.tolist() == [[i % 3, 100 + i] for i in range(5)]


def test_integer_labels_keep_an_integer_dtype(split) -> None:
    _, labels = make_tester().get_all_embeddings(split, make_model())
    assert labels.dtype == torch.int64


def test_string_labels_are_mapped_by_rank() -> None:
    names = ["owl", "cat", "dog", "cat", "owl"]
    items = ListDataset([(torch.randn(5), name) for name in names])
    options = {"set_min_label_to_zero": True, "dataset_labels": names + ["ant"]}
    _, labels = make_tester(batch_size=2, **options).get_all_embeddings(items, make_model())
    ranks = {"ant": 0, "cat": 1, "dog": 2, "owl": 3}
    assert labels[:, 0].tolist() == [ranks[name] for name in names]


def test_2d_string_labels_are_mapped_per_level() -> None:
    pairs = [("cat", "mammal"), ("owl", "bird"), ("dog", "mammal")]
    items = ListDataset([(torch.randn(5), pair) for pair in pairs])
    options = {"set_min_label_to_zero": True, "dataset_labels": pairs}
    _, labels = make_tester(batch_size=2, **options).get_all_embeddings(items, make_model())
    assert labels.tolist() == [[0, 1], [2, 0], [1, 1]]


def test_sparse_labels_are_mapped_with_dataset_labels(split) -> None:
    data, labels = split.tensors
    sparse = labels * 1000 + 7
    options = {"set_min_label_to_zero": True, "dataset_labels": sparse.numpy()}
    _, got = make_tester(**options).get_all_embeddings(TensorDataset(data, sparse), make_model())
    assert torch.equal(got[:, 0], torch.unique(sparse, return_inverse=True)[1])


def test_string_labels_without_mapping_are_an_error() -> None:
    items = ListDataset([(torch.randn(5), "cat"), (torch.randn(5), "dog")])
    with pytest.raises(InvalidTypeError, match="labels of split 'val' must be numeric"):
        make_tester().test({"val": items}, 1, make_model())


def test_get_all_embeddings_with_pca_fits_on_the_dataset(split) -> None:
    model = make_model(5, 4)
    embeddings, _ = make_tester(pca=2).get_all_embeddings(split, model)
    raw = embed_by_hand(model, split.tensors[0], normalize=False).double().numpy()
    projected = PCA(2, svd_solver="full").fit_transform(StandardScaler().fit_transform(raw))
    expected = projected / np.linalg.norm(projected, axis=1, keepdims=True)
    signs = np.sign((embeddings.double().numpy() * expected).sum(0))
    np.testing.assert_allclose(embeddings.double().numpy() * signs, expected, atol=1e-5)


# --------------------------------------------------------------------------- bad input


def test_items_without_labels_are_an_error_naming_the_split() -> None:
    items = ListDataset([torch.randn(5) for _ in range(4)])
    with pytest.raises(InvalidArgumentError, match=r"split 'val'.*\(data, label\)"):
        make_tester(batch_size=2).test({"val": items}, 1, make_model())


def test_items_of_three_parts_are_an_error_for_the_global_tester() -> None:
    items = ListDataset([(torch.randn(5), torch.randn(5), 1) for _ in range(4)])
    with pytest.raises(InvalidArgumentError, match=r"split 'val'.*length 3"):
        make_tester().test({"val": items}, 1, make_model())


def test_a_getter_with_the_wrong_result_is_an_error(split) -> None:
    bad = make_tester(data_and_label_getter=lambda batch: batch[0])
    with pytest.raises(InvalidArgumentError, match="data_and_label_getter's result"):
        bad.test({"val": split}, 1, make_model())


def test_an_empty_split_is_an_error_naming_it(split) -> None:
    empty = TensorDataset(torch.empty(0, 5), torch.empty(0, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="Split 'test' is empty"):
        make_tester().test({"val": split, "test": empty}, 1, make_model())


def test_a_dataset_without_len_is_an_error() -> None:
    with pytest.raises(InvalidTypeError, match="Split 'val' must be a dataset"):
        make_tester().test({"val": iter([])}, 1, make_model())


@pytest.mark.parametrize(
    ("keep", "message"),
    [(slice(0, -1), "yielded 8 items, but its len"), (slice(None), "more items than its len")],
)
def test_a_collate_fn_that_changes_the_item_count_is_an_error(split, keep, message) -> None:
    def collate(items):
        items = items[keep] if keep != slice(None) else items + items[:1]
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    with pytest.raises(InvalidArgumentError, match=message):
        make_tester(batch_size=9).get_all_embeddings(split, make_model(), collate_fn=collate)


def test_labels_with_too_few_levels_are_an_error_naming_the_split(split) -> None:
    with pytest.raises(InvalidArgumentError, match=r"split 'val' have 1 level.*=2"):
        make_tester(label_hierarchy_level=2).test({"val": split}, 1, make_model())


def test_labels_with_too_many_dimensions_are_an_error() -> None:
    data, labels = torch.randn(4, 5), torch.zeros(4, 2, 2, dtype=torch.long)
    with pytest.raises(InvalidArgumentError, match="labels of split 'val'"):
        make_tester().test({"val": TensorDataset(data, labels)}, 1, make_model())


@pytest.mark.parametrize("references", [["val", "wide"], ["wide"]])
def test_splits_with_different_label_levels_are_an_error(split, references) -> None:
    wide = TensorDataset(torch.randn(4, 5), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match=r"\['val', 'wide'\].*same number of label"):
        make_tester().test(
            {"val": split, "wide": wide}, 1, make_model(), splits_to_eval=[("val", references)]
        )


def test_a_model_output_that_is_not_2d_is_an_error(split) -> None:
    with pytest.raises(InvalidArgumentError, match=r"output for split 'val' must be a 2-D"):
        make_tester().test({"val": split}, 1, lambda x: x[:, :, None])


def test_dataset_dict_must_be_a_non_empty_mapping() -> None:
    with pytest.raises(InvalidArgumentError, match="'dataset_dict'"):
        make_tester().test({}, 1, make_model())


def test_wrong_label_levels_fail_before_the_next_split_is_embedded(split) -> None:
    later = CountingDataset(torch.randn(4, 5), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="split 'val'"):
        make_tester(label_hierarchy_level=1).test({"val": split, "later": later}, 1, make_model())
    assert later.reads == 0
