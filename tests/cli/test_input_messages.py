"""Each message of issue 31 names its argument or file, and no traceback reaches the user."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.cli.threshold import area_under_roc
from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.evaluation import (
    AccuracyCalculator,
    bootstrap_interval,
    compare_per_query,
)

from .conftest import error_line


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text


def test_auc_matches_a_pairwise_count() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 60).astype(float)  # many ties
    same = rng.random(60) < 0.4
    pos, neg = scores[same], scores[~same]
    wins = sum((p < n) + 0.5 * (p == n) for p in pos for n in neg)  # distances: lower = alike
    expected = wins / (len(pos) * len(neg))
    got = area_under_roc(torch.from_numpy(scores), torch.from_numpy(same), is_inverted=False)
    assert got == pytest.approx(expected)
    flipped = area_under_roc(torch.from_numpy(scores), torch.from_numpy(same), is_inverted=True)
    assert flipped == pytest.approx(1 - expected)


def test_threshold_says_similarities_look_inverted(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    same = rng.random(200) < 0.5
    np.save(tmp_path / "s.npy", np.where(same, 0.8, 0.2) + rng.normal(0, 0.05, 200))
    np.save(tmp_path / "m.npy", same)
    result = cli("threshold", tmp_path / "s.npy", "--labels", tmp_path / "m.npy")
    assert result.code == 0
    assert "pml-eval: warning: the scores look inverted" in result.err
    assert "--similarity" in result.err
    right = cli("threshold", tmp_path / "s.npy", "--labels", tmp_path / "m.npy", "--similarity")
    assert "inverted" not in right.err


@pytest.mark.parametrize("command", ["evaluate", "compare"])
def test_negative_seed_is_a_usage_error(cli, tmp_path: Path, command: str) -> None:
    np.save(tmp_path / "e.npy", np.random.default_rng(0).normal(size=(20, 3)))
    np.save(tmp_path / "l.npy", np.arange(20) % 2)
    files = [tmp_path / "e.npy"] * (2 if command == "compare" else 1)
    ci = ["--ci", "90"] if command == "evaluate" else []
    result = cli(command, *files, "--labels", tmp_path / "l.npy", *ci, "--seed", "-1")
    assert result.code == 2
    assert "--seed" in error_line(result.err)
    _no_traceback(result.err)


def test_negative_seed_in_the_api() -> None:
    with pytest.raises(InvalidArgumentError, match="'seed' parameter of bootstrap_interval"):
        bootstrap_interval(torch.rand(10), seed=-1)


def _per_query(labels: torch.Tensor, include: tuple[str, ...]):
    embeddings = torch.arange(len(labels), dtype=torch.float32).unsqueeze(1)
    calculator = AccuracyCalculator(include=include)
    return calculator.get_accuracy(embeddings, labels, return_per_query=True)["per_query"]


def test_compare_per_query_refuses_other_labels() -> None:
    first = _per_query(torch.tensor([0, 0, 1, 1, 2, 2]), ("precision_at_1",))
    second = _per_query(torch.tensor([0, 0, 2, 2, 1, 1]), ("precision_at_1",))
    with pytest.raises(InvalidArgumentError, match="same labels.*4 of 6"):
        compare_per_query(first, second)


def test_compare_per_query_needs_a_common_metric() -> None:
    labels = torch.tensor([0, 0, 1, 1])
    first = _per_query(labels, ("precision_at_1",))
    second = _per_query(labels, ("r_precision",))
    with pytest.raises(InvalidArgumentError, match="no metric in common.*precision_at_1"):
        compare_per_query(first, second)


def test_zero_columns_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="'query'.*at least one column"):
        AccuracyCalculator().get_accuracy(torch.zeros(6, 0), torch.tensor([0, 0, 1, 1, 2, 2]))


LABELS = torch.tensor([0, 0, 1, 1])


@pytest.mark.parametrize(
    ("query", "labels", "param", "what"),
    [
        (torch.zeros(4, 2, device="meta"), LABELS, "query", "meta"),
        (torch.randn(4, 2).to_sparse(), LABELS, "query", "sparse"),
        (torch.randn(4, 2, dtype=torch.complex64), LABELS, "query", "complex"),
        (torch.randn(4, 2), LABELS.to(torch.complex64), "query_labels", "complex"),
        (torch.randn(4, 2), torch.empty(4, device="meta"), "query_labels", "meta"),
        (torch.randn(4, 2), LABELS.to_sparse(), "query_labels", "sparse"),
    ],
)
def test_tensors_without_plain_values_are_refused(query, labels, param: str, what: str) -> None:
    with pytest.raises(InvalidTypeError, match=f"'{param}' parameter.*{what}"):
        AccuracyCalculator().get_accuracy(query, labels)


def test_small_k_warning_in_cli_words(cli, tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.random.default_rng(0).normal(size=(12, 3)))
    np.save(tmp_path / "l.npy", np.arange(12) % 2)
    result = cli("evaluate", tmp_path / "e.npy", "--labels", tmp_path / "l.npy", "--k", "2")
    assert result.code == 0
    warning = [line for line in result.err.splitlines() if "--k 2" in line]
    assert len(warning) == 1 and warning[0].startswith("pml-eval: warning: ")
    assert "k='max_bin_count'" not in result.err and "--k max_bin_count" in warning[0]
    assert re.search(r"r_precision \(!\)", result.out)
    assert re.search(r"precision_at_1 +\d", result.out)  # not marked: k = 2 is enough for it


def test_per_class_keeps_uint64_labels(cli, tmp_path: Path) -> None:
    big = 2**63
    labels = np.array([big, big, big + 5, big + 5, 3, 3], dtype=np.uint64)
    np.save(tmp_path / "l.npy", labels)
    np.save(tmp_path / "e.npy", np.array([[0.0], [0.1], [5.0], [5.1], [9.0], [9.1]]))
    result = cli("evaluate", tmp_path / "e.npy", "--labels", tmp_path / "l.npy", "--per-class")
    assert result.code == 0, result.err
    assert str(big) in result.out and str(big + 5) in result.out
    assert "-9223372036854775808" not in result.out


@pytest.mark.parametrize(
    ("scores", "what"),
    [
        (torch.zeros(4, device="meta"), "meta"),
        (torch.tensor([0.1, 0.2, 0.3, 0.4]).to_sparse(), "sparse"),
        (torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.complex64), "complex64"),
    ],
)
def test_scores_without_plain_values_are_refused(scores, what: str) -> None:
    from pytorch_metric_learning.evaluation import match_f1, select_threshold

    labels = torch.tensor([True, False, True, False])
    error = ValueError if what == "complex64" else InvalidTypeError  # as other dtypes
    with pytest.raises(error, match=f"'scores' parameter.*{what}"):
        select_threshold(scores, labels, match_f1, is_inverted=False)


def test_cli_device_input_is_not_a_regular_file(cli) -> None:
    result = cli("evaluate", "/dev/null", "--labels", "/dev/null")
    assert result.code == 1
    assert "'/dev/null' is not a regular file" in error_line(result.err)
    assert "does not exist" not in result.err
    _no_traceback(result.err)


def test_cli_reads_a_label_column_of_a_csv(cli, tmp_path: Path) -> None:
    path = tmp_path / "emb.csv"
    rows = [f"{i % 2 * 10 + i * 0.01},{i},{'ab'[i % 2]}" for i in range(8)]
    path.write_text("x,y,label\n" + "\n".join(rows) + "\n")
    result = cli(
        "evaluate", f"{path}:x", "--labels", f"{path}:label", "--metrics", "precision_at_1"
    )
    assert result.code == 0, result.err
    assert re.search(r"precision_at_1 +1\.0000", result.out)
    missing = cli("evaluate", f"{path}:x", "--labels", f"{path}:class")
    assert missing.code == 1
    assert "has no column 'class'" in error_line(missing.err)
    _no_traceback(missing.err)


def test_resamples_has_an_upper_bound_named(cli) -> None:
    result = cli("compare", "a.npy", "b.npy", "--labels", "l.npy", "--ci", "95",
                 "--resamples", "99999999999999999999")  # fmt: skip
    assert result.code == 2 and "--resamples" in result.err and "1000000" in result.err
    _no_traceback(result.err)


@pytest.mark.parametrize(
    ("seed", "accepted"),
    [(0, True), (2**64 - 1, True), (None, True), (-1, False), (2**64, False), (10**23, False)],
)
def test_kmeans_seed_range_is_named(seed: int | None, accepted: bool) -> None:
    from pytorch_metric_learning.evaluation import TorchKMeans

    if accepted:
        TorchKMeans(seed=seed)(torch.randn(8, 2), 2)  # torch's generator takes it
    else:
        with pytest.raises(
            InvalidArgumentError, match="'seed' parameter of TorchKMeans.*2\\*\\*64"
        ):
            TorchKMeans(seed=seed)


def test_long_values_are_cut_in_messages() -> None:
    from pytorch_metric_learning.evaluation import TorchKMeans

    with pytest.raises(InvalidArgumentError) as raised:
        TorchKMeans(seed=10**4000)
    assert len(str(raised.value)) < 300 and "4001 characters" in str(raised.value)
    with pytest.raises(InvalidArgumentError, match="an int of 16610 bits"):
        TorchKMeans(seed=10**5000)
