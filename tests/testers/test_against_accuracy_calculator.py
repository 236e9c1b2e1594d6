"""End to end: the testers' numbers equal AccuracyCalculator called on embeddings made by hand.

A fixed-seed linear model on small class-clustered splits. For every splits_to_eval form of
the spec the expected numbers come from AccuracyCalculator().get_accuracy on embeddings
computed here with plain PyTorch (and scikit-learn for PCA).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler
from tester_helpers import quiet
from torch.utils.data import TensorDataset

from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    CustomKNN,
    register_knn_backend,
)
from pytorch_metric_learning.evaluation.search import registry
from pytorch_metric_learning.testers import (
    GlobalEmbeddingSpaceTester,
    GlobalTwoStreamEmbeddingSpaceTester,
    WithSameParentLabelTester,
)

SIZES = {"train": 24, "val": 15, "test": 12}
CENTRES = torch.randn(4, 6, generator=torch.Generator().manual_seed(123)) * 2.0


def clustered(num: int, seed: int, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (num,), generator=generator)
    data = CENTRES[labels] + noise * torch.randn(num, 6, generator=generator)
    # level 1: parents {0, 1} -> 10 and {2, 3} -> 11
    return data, torch.stack([labels, labels // 2 + 10], dim=1)


def splits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: clustered(size, seed=i) for i, (name, size) in enumerate(SIZES.items())}


def as_datasets(raw: dict) -> dict[str, TensorDataset]:
    return {name: TensorDataset(data, labels) for name, (data, labels) in raw.items()}


def model() -> torch.nn.Linear:
    torch.manual_seed(7)
    return torch.nn.Linear(6, 4)


def by_hand(net: torch.nn.Module, data: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.nn.functional.normalize(net(data), dim=1)


def expected_scores(query, query_labels, reference, reference_labels, includes) -> dict:
    return AccuracyCalculator().get_accuracy(
        query, query_labels, reference, reference_labels, ref_includes_query=includes
    )


def assert_scores_equal(actual: dict, expected: dict, suffix: str = "_level0") -> None:
    assert set(actual) == {"epoch"} | {f"{metric}{suffix}" for metric in expected}
    for metric, value in expected.items():
        assert actual[f"{metric}{suffix}"] == pytest.approx(value, rel=1e-6, abs=1e-9), metric


# (splits_to_eval, {query split: (reference splits in the order they are concatenated, includes)})
FORMS = [
    (None, {n: ([n], True) for n in SIZES}),
    ([("test", ["train"])], {"test": (["train"], False)}),
    ([("test", ["test", "train"])], {"test": (["test", "train"], True)}),
    ([("test", ["train", "test"])], {"test": (["test", "train"], True)}),
    ([("val", ["train", "test"])], {"val": (["train", "test"], False)}),
    (
        [("val", ["train", "val", "test"]), ("test", ["val"]), ("train", ["train"])],
        {
            "val": (["val", "train", "test"], True),
            "test": (["val"], False),
            "train": (["train"], True),
        },
    ),
]


@pytest.mark.parametrize(("splits_to_eval", "expected_plan"), FORMS)
def test_every_splits_to_eval_form_matches_the_calculator(splits_to_eval, expected_plan) -> None:
    raw, net = splits(), model()
    tester = GlobalEmbeddingSpaceTester(**quiet(batch_size=5))
    accuracies = tester.test(as_datasets(raw), 1, net, splits_to_eval=splits_to_eval)
    assert list(accuracies) == list(expected_plan)
    for query_name, (reference_names, includes) in expected_plan.items():
        query = by_hand(net, raw[query_name][0])
        reference = torch.cat([by_hand(net, raw[name][0]) for name in reference_names])
        reference_labels = torch.cat([raw[name][1][:, 0] for name in reference_names])
        expected = expected_scores(
            query, raw[query_name][1][:, 0], reference, reference_labels, includes
        )
        assert_scores_equal(accuracies[query_name], expected)


def test_default_calculator_is_an_accuracy_calculator() -> None:
    assert isinstance(GlobalEmbeddingSpaceTester().accuracy_calculator, AccuracyCalculator)


def test_all_levels_and_averages_match_the_calculator() -> None:
    raw, net = splits(), model()
    tester = GlobalEmbeddingSpaceTester(**quiet(label_hierarchy_level="all"))
    accuracies = tester.test(as_datasets(raw), 1, net, splits_to_eval=[("test", ["train"])])["test"]
    query, reference = by_hand(net, raw["test"][0]), by_hand(net, raw["train"][0])
    per_level = [
        expected_scores(query, raw["test"][1][:, L], reference, raw["train"][1][:, L], False)
        for L in (0, 1)
    ]
    for metric in per_level[0]:
        for L in (0, 1):
            assert accuracies[f"{metric}_level{L}"] == pytest.approx(per_level[L][metric], rel=1e-6)
        mean = (per_level[0][metric] + per_level[1][metric]) / 2
        assert accuracies[f"AVERAGE_{metric}"] == pytest.approx(mean, rel=1e-6)


def test_pca_matches_the_calculator_on_sklearn_projections() -> None:
    raw, net = splits(), model()
    tester = GlobalEmbeddingSpaceTester(**quiet(pca=2))
    accuracies = tester.test(as_datasets(raw), 1, net, splits_to_eval=[("test", ["train", "test"])])
    with torch.no_grad():
        raw_query = net(raw["test"][0]).double().numpy()
        raw_reference = np.concatenate([raw_query, net(raw["train"][0]).double().numpy()])
    scaler = StandardScaler().fit(raw_reference)
    pca = PCA(2, svd_solver="full").fit(scaler.transform(raw_reference))

    def project(x: np.ndarray) -> torch.Tensor:
        out = torch.from_numpy(pca.transform(scaler.transform(x))).float()
        return torch.nn.functional.normalize(out, dim=1)

    reference = project(raw_reference)
    labels = torch.cat([raw["test"][1][:, 0], raw["train"][1][:, 0]])
    expected = expected_scores(reference[:12], labels[:12], reference, labels, True)
    assert_scores_equal(accuracies["test"], expected, suffix="_level0_pca2")


def test_same_parent_equals_the_per_parent_average_by_hand() -> None:
    raw, net = splits(), model()
    tester = WithSameParentLabelTester(**quiet())
    accuracies = tester.test(as_datasets(raw), 1, net, splits_to_eval=[("test", ["train"])])
    query, reference = by_hand(net, raw["test"][0]), by_hand(net, raw["train"][0])
    q_labels, r_labels = raw["test"][1], raw["train"][1]
    per_parent = []
    for parent in (10, 11):
        q_rows, r_rows = q_labels[:, 1] == parent, r_labels[:, 1] == parent
        per_parent.append(
            expected_scores(
                query[q_rows], q_labels[q_rows, 0], reference[r_rows], r_labels[r_rows, 0], False
            )
        )
    expected = {m: sum(scores[m] for scores in per_parent) / 2 for m in per_parent[0]}
    assert_scores_equal(accuracies["test"], expected)


def test_same_parent_self_retrieval_matches_by_hand() -> None:
    raw, net = splits(), model()
    accuracies = WithSameParentLabelTester(**quiet()).test(
        {"val": TensorDataset(*raw["val"])}, 1, net
    )
    embeddings, labels = by_hand(net, raw["val"][0]), raw["val"][1]
    per_parent = []
    for parent in (10, 11):
        rows = labels[:, 1] == parent
        per_parent.append(
            expected_scores(
                embeddings[rows], labels[rows, 0], embeddings[rows], labels[rows, 0], True
            )
        )
    expected = {m: float(np.nanmean([scores[m] for scores in per_parent])) for m in per_parent[0]}
    assert_scores_equal(accuracies["val"], expected)


def test_two_stream_matches_the_calculator_on_anchors_and_positives() -> None:
    anchors, labels = clustered(16, seed=5)
    positives = anchors + 0.3 * torch.randn(16, 6, generator=torch.Generator().manual_seed(6))
    net = model()
    tester = GlobalTwoStreamEmbeddingSpaceTester(**quiet(batch_size=3))
    data = TensorDataset(anchors, positives, labels[:, 0])
    accuracies = tester.test({"val": data}, 1, net)
    expected = expected_scores(
        by_hand(net, anchors), labels[:, 0], by_hand(net, positives), labels[:, 0], False
    )
    assert_scores_equal(accuracies["val"], expected)


@pytest.fixture
def clean_registry():
    yield
    registry._reset_for_tests()


def test_a_backend_spec_reaches_the_calculator(clean_registry) -> None:
    searched = []

    class RecordingKNN(CustomKNN):
        def __call__(self, query, k, reference=None, ref_includes_query=False):
            searched.append((len(query), len(reference), ref_includes_query))
            return super().__call__(query, k, reference, ref_includes_query)

    register_knn_backend(
        "testers_recording_knn",
        lambda: RecordingKNN(LpDistance(normalize_embeddings=False, power=2)),
        override=True,
    )
    calculator = AccuracyCalculator(include=("precision_at_1",), knn_func="testers_recording_knn")
    raw = splits()
    tester = GlobalEmbeddingSpaceTester(accuracy_calculator=calculator, **quiet())
    accuracies = tester.test(as_datasets(raw), 1, model(), splits_to_eval=[("test", ["train"])])
    assert searched == [(12, 24, False)]
    assert not math.isnan(accuracies["test"]["precision_at_1_level0"])


@pytest.mark.faiss
def test_faiss_backends_by_name_give_the_same_numbers() -> None:
    pytest.importorskip("pytorch_metric_learning_faiss")
    raw, net = splits(), model()
    faiss_calculator = AccuracyCalculator(
        exclude=("NMI", "AMI"), knn_func="faiss", kmeans_func="faiss"
    )
    torch_calculator = AccuracyCalculator(exclude=("NMI", "AMI"))
    results = []
    for calculator in (faiss_calculator, torch_calculator):
        tester = GlobalEmbeddingSpaceTester(accuracy_calculator=calculator, **quiet())
        results.append(tester.test(as_datasets(raw), 1, net))
    for split in SIZES:
        for key, value in results[1][split].items():
            assert results[0][split][key] == pytest.approx(value, rel=1e-6), key


def test_same_parent_leaves_out_a_parent_of_lone_queries() -> None:
    net = model()
    query_data, query_labels = clustered(12, seed=8)
    reference_data, reference_labels = clustered(30, seed=9)
    keep = reference_labels[:, 0] != 3  # label 3 (parent 11) only in the query ...
    reference_data, reference_labels = reference_data[keep], reference_labels[keep]
    query_labels[query_labels[:, 1] == 11, 0] = 3  # ... and every parent-11 query has it
    data = {
        "q": TensorDataset(query_data, query_labels),
        "r": TensorDataset(reference_data, reference_labels),
    }
    tester = WithSameParentLabelTester(
        accuracy_calculator=AccuracyCalculator(exclude=("NMI", "AMI")), **quiet()
    )
    with pytest.warns(UserWarning, match=r"parent labels \[11\].*left out"):
        accuracies = tester.test(data, 1, net, splits_to_eval=[("q", ["r"])])["q"]
    rows, ref_rows = query_labels[:, 1] == 10, reference_labels[:, 1] == 10
    expected = AccuracyCalculator(exclude=("NMI", "AMI")).get_accuracy(
        by_hand(net, query_data)[rows],
        query_labels[rows, 0],
        by_hand(net, reference_data)[ref_rows],
        reference_labels[ref_rows, 0],
    )
    assert_scores_equal(accuracies, expected)
