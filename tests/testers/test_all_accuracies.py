"""Keys and structure of all_accuracies: levels, AVERAGE_, _pcaN, epoch; PCA per evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler
from tester_helpers import SpyCalculator, embed_by_hand, make_model, quiet
from torch.utils.data import TensorDataset

from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester


class LevelSpy(SpyCalculator):
    """Returns metrics that depend on the labels it receives, to tell levels apart."""

    def get_accuracy(self, query, query_labels, reference=None, reference_labels=None, **kwargs):
        super().get_accuracy(query, query_labels, reference, reference_labels, **kwargs)
        return {"precision_at_1": float(query_labels.max()), "NMI": float(query_labels.min())}


def hierarchical(num: int = 12, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(num, 5, generator=generator)
    fine = torch.arange(num) % 4
    labels = torch.stack([fine, fine // 2 + 10, torch.full((num,), 20)], dim=1)
    return TensorDataset(data, labels)


def run(**options) -> dict:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=LevelSpy(), **quiet(**options))
    return tester.test({"val": hierarchical()}, 4, make_model())


def test_level_0_keys() -> None:
    accuracies = run()
    assert accuracies == {"val": {"epoch": 4, "precision_at_1_level0": 3.0, "NMI_level0": 0.0}}


def test_an_int_level_selects_that_label_column() -> None:
    assert run(label_hierarchy_level=1)["val"] == {
        "epoch": 4,
        "precision_at_1_level1": 11.0,
        "NMI_level1": 10.0,
    }


def test_a_list_of_levels_adds_averages() -> None:
    assert run(label_hierarchy_level=[0, 2])["val"] == {
        "epoch": 4,
        "precision_at_1_level0": 3.0,
        "NMI_level0": 0.0,
        "precision_at_1_level2": 20.0,
        "NMI_level2": 20.0,
        "AVERAGE_precision_at_1": 11.5,
        "AVERAGE_NMI": 10.0,
    }


def test_all_levels_add_averages() -> None:
    accuracies = run(label_hierarchy_level="all")["val"]
    assert accuracies["precision_at_1_level1"] == 11.0
    assert accuracies["AVERAGE_precision_at_1"] == pytest.approx((3 + 11 + 20) / 3)
    assert accuracies["AVERAGE_NMI"] == pytest.approx((0 + 10 + 20) / 3)
    assert len(accuracies) == 1 + 3 * 2 + 2


def test_pca_suffixes_every_metric_key() -> None:
    accuracies = run(pca=3, label_hierarchy_level="all")["val"]
    assert set(accuracies) == {
        "epoch",
        *(f"{m}_level{L}_pca3" for m in ("precision_at_1", "NMI") for L in range(3)),
        "AVERAGE_precision_at_1_pca3",
        "AVERAGE_NMI_pca3",
    }


def test_keyname_helper() -> None:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=SpyCalculator(), pca=8)
    assert tester.accuracies_keyname("r_precision", 2) == "r_precision_level2_pca8"
    assert tester.accuracies_keyname("NMI", average=True) == "AVERAGE_NMI_pca8"


def test_all_accuracies_is_stored_and_replaced_by_each_test() -> None:
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=LevelSpy(), **quiet())
    first = tester.test({"val": hierarchical()}, 1, make_model())
    assert tester.all_accuracies is first
    tester.test({"other": hierarchical()}, 2, make_model())
    assert list(tester.all_accuracies) == ["other"]
    assert tester.all_accuracies["other"]["epoch"] == 2


def test_epoch_never_changes_a_computation() -> None:
    def scores(epoch: int) -> dict:
        tester = GlobalEmbeddingSpaceTester(accuracy_calculator=LevelSpy(), **quiet(pca=2))
        result = tester.test({"val": hierarchical()}, epoch, make_model())["val"]
        return {k: v for k, v in result.items() if k != "epoch"}, tester.accuracy_calculator.calls

    (first, calls_1), (second, calls_2) = scores(1), scores(99)
    assert first == second
    assert all(torch.equal(a["query"], b["query"]) for a, b in zip(calls_1, calls_2))


def test_per_class_lists_are_kept_and_not_averaged() -> None:
    spy = SpyCalculator({"precision_at_1": [0.5, 1.0]})
    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=spy, **quiet(label_hierarchy_level=[0, 1])
    )
    accuracies = tester.test({"val": hierarchical()}, 1, make_model())["val"]
    assert accuracies["precision_at_1_level1"] == [0.5, 1.0]
    assert "AVERAGE_precision_at_1" not in accuracies


# --------------------------------------------------------------------------- PCA per evaluation


def pca_by_hand(reference: np.ndarray, x: np.ndarray, dims: int) -> np.ndarray:
    scaler = StandardScaler().fit(reference)
    projected = PCA(dims, svd_solver="full").fit(scaler.transform(reference))
    out = projected.transform(scaler.transform(x))
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def align(actual: torch.Tensor, expected: np.ndarray) -> np.ndarray:
    actual = actual.double().numpy()
    return actual * np.sign((actual * expected).sum(0))


def test_pca_is_fitted_on_the_reference_and_applied_to_the_query(spy) -> None:
    model = make_model(5, 4)
    query_split, reference_split = hierarchical(7, seed=1), hierarchical(15, seed=2)
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=spy, **quiet(pca=2))
    tester.test({"q": query_split, "r": reference_split}, 1, model, splits_to_eval=[("q", ["r"])])
    (call,) = spy.calls
    raw_q = embed_by_hand(model, query_split.tensors[0], normalize=False).double().numpy()
    raw_r = embed_by_hand(model, reference_split.tensors[0], normalize=False).double().numpy()
    expected_r = pca_by_hand(raw_r, raw_r, 2)
    signs = np.sign((call["reference"].double().numpy() * expected_r).sum(0))
    np.testing.assert_allclose(call["reference"].double().numpy() * signs, expected_r, atol=1e-5)
    expected_q = pca_by_hand(raw_r, raw_q, 2)
    np.testing.assert_allclose(call["query"].double().numpy() * signs, expected_q, atol=1e-5)


def test_pca_with_the_query_in_the_reference_keeps_the_prefix_exact(spy) -> None:
    data = {"q": hierarchical(7, seed=1), "r": hierarchical(15, seed=2)}
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=spy, **quiet(pca=3))
    tester.test(data, 1, make_model(), splits_to_eval=[("q", ["r", "q"])])
    (call,) = spy.calls
    assert call["ref_includes_query"] is True
    assert call["query"].shape == (7, 3) and call["reference"].shape == (22, 3)
    assert torch.equal(call["reference"][:7], call["query"])
    torch.testing.assert_close(call["query"].norm(dim=1), torch.ones(7))


def test_pca_without_normalization_leaves_the_projection_unscaled(spy) -> None:
    model, split = make_model(5, 4), hierarchical(10)
    tester = GlobalEmbeddingSpaceTester(
        accuracy_calculator=spy, **quiet(pca=2, normalize_embeddings=False)
    )
    tester.test({"val": split}, 1, model)
    raw = embed_by_hand(model, split.tensors[0], normalize=False).double().numpy()
    scaler = StandardScaler().fit(raw)
    expected = PCA(2, svd_solver="full").fit_transform(scaler.transform(raw))
    np.testing.assert_allclose(align(spy.calls[0]["query"], expected), expected, atol=1e-5)
