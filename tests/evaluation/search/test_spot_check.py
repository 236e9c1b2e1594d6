"""Issue 32: each plugin mistake is caught by AccuracyCalculator and check_knn_backend with
a message naming it; the built-in backends pass unchanged; an approximate backend gets its
recall in a warning. The fakes (tests/fakes/knn_mistakes.py) each make one mistake."""

from __future__ import annotations

import importlib.util
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

from pytorch_metric_learning import errors
from pytorch_metric_learning.cli._backend_check import _one_process_group
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.errors import BackendOutputError
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    CustomKNN,
    check_knn_backend,
    load_knn_func,
    register_knn_backend,
    remove_self_matches,
)
from pytorch_metric_learning.evaluation.search import registry
from pytorch_metric_learning.evaluation.search._checked_search import (
    ApproximateSearchWarning,
    search_knn,
)
from pytorch_metric_learning.evaluation.search._spot_check import knn_is_exact

_PATH = Path(__file__).parents[2] / "fakes" / "knn_mistakes.py"
_SPEC = importlib.util.spec_from_file_location("knn_mistakes", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
mistakes = importlib.util.module_from_spec(_SPEC)
sys.modules["knn_mistakes"] = mistakes
_SPEC.loader.exec_module(mistakes)

# (fake, distance option, what the message must say)
MISTAKES = [
    (mistakes.AscendingSimilarities, "cosine", "ascending similarities"),
    (mistakes.SortedCopyIndices, "euclidean", "indices of another ordering"),
    (mistakes.WrongMetric, "cosine", "wrong metric"),
    (mistakes.UndeclaredApproximate, "euclidean", "declare is_exact = False"),
    (mistakes.ModifiesInputs, "euclidean", "modified its inputs"),
    (mistakes.UsearchPadding, "euclidean", "usearch-style padding"),
    (mistakes.PynndescentPadding, "euclidean", "pynndescent-style"),
]


def data(n: int = 600, dims: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    centers = 3 * torch.randn(10, dims, generator=generator)
    return centers[labels] + torch.randn(n, dims, generator=generator), labels


def calculator(factory, distance: str) -> AccuracyCalculator:
    register_knn_backend("mistake", factory, override=True)
    return AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r"),
        knn_func={"name": "mistake", "distance": distance},
    )


@pytest.mark.parametrize(("factory", "distance", "named"), MISTAKES)
def test_accuracy_calculator_catches_each_mistake(factory, distance, named) -> None:
    x, y = data()
    with pytest.raises(errors.BackendOutputError, match="'mistake'") as info:
        calculator(factory, distance).get_accuracy(x, y)
    assert named in str(info.value)


@pytest.mark.parametrize(("factory", "distance", "named"), MISTAKES)
def test_check_knn_backend_catches_each_mistake(factory, distance, named) -> None:
    register_knn_backend("mistake", factory, override=True)
    with pytest.raises(errors.BackendOutputError) as info:
        check_knn_backend("mistake", size=300)
    assert named in str(info.value)


def test_modified_inputs_are_blamed_on_the_backend_not_nondeterminism() -> None:
    x, _ = data()
    with pytest.raises(errors.BackendOutputError, match="modified its inputs"):
        search_knn(mistakes.ModifiesInputs(), x.clone(), 5, x.clone(), False)


def test_an_in_place_torch_change_is_seen_by_the_version_counter() -> None:
    def normalizing(query, k, reference=None, ref_includes_query=False):
        query.div_(query.norm(dim=1, keepdim=True))
        return CustomKNN(LpDistance(normalize_embeddings=False))(
            query, k, reference, ref_includes_query
        )

    x, _ = data()
    with pytest.raises(errors.BackendOutputError, match="modified its inputs"):
        search_knn(normalizing, x.clone(), 5, x.clone(), False)


def test_an_error_inside_the_search_names_the_backend_and_chains_the_original() -> None:
    x, y = data()
    with pytest.raises(errors.BackendRuntimeError, match="'mistake'.*HNSW graph corrupted") as info:
        calculator(mistakes.RaisesInSearch, "euclidean").get_accuracy(x, y)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "registered in-process" in str(info.value)


def test_the_approximate_backend_gets_a_recall_warning_not_an_error(caplog) -> None:
    x, y = data()
    calc = calculator(mistakes.DeclaredApproximate, "euclidean")
    with caplog.at_level(logging.WARNING), pytest.warns(ApproximateSearchWarning) as record:
        calc.get_accuracy(x, y)
    # the fake misses each query's nearest: at most (k - 1) / k of the k nearest are found,
    # more only where the (k + 1)-th nearest ties the k-th within float rounding
    k = calc.last_knn_check.k
    assert (k - 1) / k <= calc.last_knn_check.recall < 1.0
    assert "recall@" in str(record[0].message)
    assert any("approximate" in line and "recall@" in line for line in caplog.messages)


def test_an_approximate_backend_with_wrong_values_still_fails() -> None:
    class Approximate(mistakes.WrongMetric):
        is_exact = False

    x, y = data()
    with pytest.raises(errors.BackendOutputError, match="wrong metric"):
        calculator(Approximate, "cosine").get_accuracy(x, y)


def test_check_knn_backend_catches_an_approximate_index_that_is_not_deterministic() -> None:
    register_knn_backend("threaded", mistakes.ThreadedApproximate, override=True)
    with pytest.raises(errors.BackendOutputError, match="different distances or neighbours"):
        check_knn_backend("threaded", size=300)


def test_the_builtin_backends_pass_unchanged() -> None:
    checks = check_knn_backend("custom", size=300)
    with _one_process_group():  # torch_distributed needs a process group, even of one
        checks += check_knn_backend("torch_distributed", size=300)
    assert all(check.exact and check.recall == 1.0 for check in checks)


@pytest.mark.faiss
def test_flat_faiss_passes_and_hnsw_declares_itself_approximate() -> None:
    pytest.importorskip("faiss")
    assert all(check.exact for check in check_knn_backend("faiss", size=300))
    hnsw = load_knn_func({"name": "faiss", "index": "HNSW32"})
    assert knn_is_exact(load_knn_func("faiss")) and not knn_is_exact(hnsw)
    x, y = data()
    calc = AccuracyCalculator(include=("precision_at_1",), knn_func=hnsw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ApproximateSearchWarning)
        calc.get_accuracy(x, y)
    assert not calc.last_knn_check.exact and 0.0 < calc.last_knn_check.recall <= 1.0


@pytest.mark.parametrize("distance", [LpDistance(normalize_embeddings=False), CosineSimilarity()])
def test_ties_in_either_order_are_accepted(distance) -> None:
    """Duplicated rows tie; a backend may list tied rows in any order."""
    x, _ = data(200)
    x = torch.cat([x, x])  # every row has an exact twin
    reference = x.clone()

    def reversed_ties(query, k, reference=None, ref_includes_query=False):
        values = distance(query, reference)
        values = values if distance.is_inverted else -values
        order = torch.arange(values.shape[1] - 1, -1, -1)  # later row first among ties
        top, at = values[:, order].topk(k, dim=1)
        return (top if distance.is_inverted else -top), order[at]

    reversed_ties.distance = distance  # type: ignore[attr-defined]
    (_, indices), check = search_knn(reversed_ties, x[:50], 4, reference, False)
    assert check.recall == 1.0 and indices.shape == (50, 4)


def test_plugin_exiting_at_import_becomes_backend_import_error(tmp_path, monkeypatch) -> None:
    (tmp_path / "fake_pml_exits.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    origin = registry.Origin("knn", "exits", "fake-exits", "fake_pml_exits:Backend")
    from pytorch_metric_learning.evaluation.search._backend_checks import load_target

    with pytest.raises(
        errors.BackendImportError, match="fake_pml_exits:Backend.*raised SystemExit"
    ):
        load_target("fake_pml_exits:Backend", origin, [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_write_that_keeps_every_row_sum_is_seen(dtype: torch.dtype) -> None:
    """Values swapped within a row through a NumPy view (no version bump, same row sum)."""
    from pytorch_metric_learning.evaluation.search._checked_search import input_fingerprint

    x = torch.arange(24, dtype=torch.float32).reshape(6, 4).to(dtype)
    before = input_fingerprint(x)
    x[0, [0, 1]] = x[0, [1, 0]].clone()
    after = input_fingerprint(x)
    assert not all(
        torch.equal(old[3], new[3]) for old, new in zip(before, after) if old[3] is not None
    )


def test_a_backend_swapping_values_within_a_row_is_named() -> None:
    class SwapWrite:
        distance = LpDistance(normalize_embeddings=False)

        def __call__(self, query, k, reference=None, ref_includes_query=False):
            reference = query if reference is None else reference
            view = query.numpy()
            view[0, [0, 1]] = view[0, [1, 0]]
            width = k + 1 if ref_includes_query else k
            d, i = self.distance(query, reference).topk(width, dim=1, largest=False)
            return remove_self_matches(d, i) if ref_includes_query else (d, i)

    x, labels = data(200, 4)
    with pytest.raises(BackendOutputError, match="modified its inputs"):
        AccuracyCalculator(include=("precision_at_1",), knn_func=SwapWrite()).get_accuracy(
            x, labels
        )


class OneMinusCosine:
    """hnswlib's cosine space, returned as is, with no distance attribute."""

    is_exact = False

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        reference = query if reference is None else reference
        return (1 - CosineSimilarity()(query, reference)).topk(k, dim=1, largest=False)


def test_one_minus_cosine_values_are_recognised_and_checked() -> None:
    x, labels = data(300, 6)
    calculator = AccuracyCalculator(include=("precision_at_1",), knn_func=OneMinusCosine())
    calculator.get_accuracy(x[:100], labels[:100], x[100:], labels[100:])
    assert calculator.last_knn_check is not None
    assert calculator.last_knn_check.recall == 1.0
