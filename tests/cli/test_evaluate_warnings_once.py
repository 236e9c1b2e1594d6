"""``pml-eval evaluate --show-worst`` says each warning once per command, and the worst
queries it ranks by the metrics' own per-query values are those ``find_worst_queries``
computes on its own (the same numbers, compared exactly)."""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.worst_queries import find_worst_queries

from .test_loaders import write

NONE_SHARED = "None of the query labels are in the reference set"


@pytest.fixture
def unmatched(tmp_path: Path) -> dict[str, Path]:
    """No query label occurs in the reference: the k-NN metrics are NaN, with a warning."""
    rng = np.random.default_rng(0)
    return {
        "q": write(tmp_path / "q.npy", rng.normal(size=(6, 3)).astype(np.float32)),
        "ql": write(tmp_path / "ql.npy", np.array([5, 5, 6, 6, 7, 7])),
        "r": write(tmp_path / "r.npy", rng.normal(size=(8, 3)).astype(np.float32)),
        "rl": write(tmp_path / "rl.npy", np.arange(8) % 4),
    }


# with the metrics' own values reused (the defaults), and with a second computation
# (--k set, or a worst metric the metrics do not include)
OPTION_SETS = [
    [],
    ["--k", "3"],
    ["--worst-metric", "recall_at_2"],
    ["--metrics", "precision_at_1,recall_at_2", "--k", "2", "--worst-metric", "recall_at_2"],
    ["--k", "50"],
]


def _messages(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("pml-eval:")]


@pytest.mark.parametrize("options", OPTION_SETS)
def test_each_warning_appears_once(cli, unmatched, options, tmp_path):
    result = cli(
        "evaluate", unmatched["q"], "--labels", unmatched["ql"], "--reference", unmatched["r"],
        "--reference-labels", unmatched["rl"], "--show-worst", 2, *options,
    )  # fmt: skip
    assert result.code == 0, result.err
    messages = _messages(result.err)
    counts = collections.Counter(messages)
    assert all(count == 1 for count in counts.values()), counts
    assert sum(NONE_SHARED in message for message in messages) == 1


def test_the_warnings_are_said_again_by_the_next_command(cli, unmatched):
    """Once per command, not once per process."""
    argv = (
        "evaluate", unmatched["q"], "--labels", unmatched["ql"], "--reference", unmatched["r"],
        "--reference-labels", unmatched["rl"], "--show-worst", 2, "--k", "3",
    )  # fmt: skip
    for _ in range(2):
        result = cli(*argv)
        assert sum(NONE_SHARED in message for message in _messages(result.err)) == 1


def test_the_default_show_worst_logs_the_warning_once(cli, unmatched, caplog):
    """The metrics' per-query values are reused: one computation, one log record."""
    with caplog.at_level(logging.WARNING, logger="pytorch_metric_learning"):
        result = cli(
            "evaluate", unmatched["q"], "--labels", unmatched["ql"], "--reference",
            unmatched["r"], "--reference-labels", unmatched["rl"], "--show-worst", 2,
        )  # fmt: skip
    assert result.code == 0, result.err
    records = [record.getMessage() for record in caplog.records]
    assert sum(NONE_SHARED in message for message in records) == 1, records


@pytest.fixture
def reid(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(4)
    ids = np.arange(40) % 8
    x = (rng.normal(size=(40, 4)) + 0.5 * ids[:, None]).astype(np.float32)
    return {
        "x": write(tmp_path / "x.npy", x),
        "ids": write(tmp_path / "ids.npy", ids),
        "cams": write(tmp_path / "cams.npy", (np.arange(40) // 8) % 3),
    }


def _count_get_accuracy(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = AccuracyCalculator.get_accuracy

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AccuracyCalculator, "get_accuracy", counted)
    return calls


@pytest.mark.parametrize("metric", ["precision_at_1", "recall_at_2", "r_precision"])
@pytest.mark.parametrize("protocol", ["plain", "groups", "single_shot"])
def test_reused_values_equal_a_separate_computation(
    cli, reid, tmp_path, monkeypatch, metric, protocol
):
    """The worst queries of the command (one get_accuracy call) equal, exactly, those
    find_worst_queries computes with its own call."""
    extra = {
        "plain": [],
        "groups": ["--query-groups", reid["cams"]],
        "single_shot": ["--query-groups", reid["cams"], "--single-gallery-shot"],
    }[protocol]
    out = tmp_path / "out.json"
    calls = _count_get_accuracy(monkeypatch)
    result = cli(
        "evaluate", reid["x"], "--labels", reid["ids"], "--metrics",
        "precision_at_1,recall_at_2,r_precision", "--show-worst", 6, "--worst-metric", metric,
        "--worst-k", 3, "--output", out, *extra,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert len(calls) == 1  # the metrics were computed once
    monkeypatch.undo()
    shown = json.loads(out.read_text())["worst_queries"]["queries"]
    x = torch.from_numpy(np.load(reid["x"]))
    ids = torch.from_numpy(np.load(reid["ids"]))
    kwargs = {}
    if protocol != "plain":
        kwargs["query_groups"] = torch.from_numpy(np.load(reid["cams"]))
    if protocol == "single_shot":
        kwargs["single_gallery_shot"] = True
    alone = find_worst_queries(x, ids, metric=metric, num_queries=6, k=3, **kwargs)
    assert [q["index"] for q in shown] == [item.index for item in alone]
    assert [q["value"] for q in shown] == [item.value for item in alone]
    assert [[r["index"] for r in q["retrievals"]] for q in shown] == [
        [r.index for r in item.retrievals] for item in alone
    ]


def test_a_second_computation_is_made_when_the_values_differ(cli, reid, monkeypatch):
    """--k makes the metrics' values those of k neighbours; the worst queries keep their
    own (every candidate), as find_worst_queries computes them."""
    calls = _count_get_accuracy(monkeypatch)
    result = cli(
        "evaluate", reid["x"], "--labels", reid["ids"], "--k", 2, "--show-worst", 2,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert len(calls) == 2


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    metric=st.sampled_from(["precision_at_1", "recall_at_3", "mean_average_precision_at_r"]),
    groups=st.booleans(),
)
def test_given_per_query_values_give_the_same_worst_queries(seed, metric, groups):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (24,), generator=generator)
    x = torch.randn(24, 3, generator=generator) + 0.4 * labels[:, None]
    protocol = {"query_groups": torch.randint(0, 2, (24,), generator=generator)} if groups else {}
    calculator = AccuracyCalculator(
        include=("precision_at_1", "recall_at_3", "mean_average_precision_at_r")
    )
    per_query = calculator.get_accuracy(x, labels, return_per_query=True, **protocol)["per_query"]
    alone = find_worst_queries(x, labels, metric=metric, num_queries=5, k=2, **protocol)
    reused = find_worst_queries(
        x, labels, metric=metric, num_queries=5, k=2, per_query=per_query, **protocol
    )
    assert reused == alone


def _bad_per_query(kind: str):
    from pytorch_metric_learning.evaluation import PerQueryValues

    indices = torch.arange(4)
    if kind == "not per-query values":
        return {"precision_at_1": torch.zeros(4)}
    if kind == "another metric":
        return PerQueryValues(indices, indices, {"recall_at_2": torch.zeros(4)})
    if kind == "too few values":
        return PerQueryValues(indices, indices, {"precision_at_1": torch.zeros(3)})
    return PerQueryValues(indices + 10, indices, {"precision_at_1": torch.zeros(4)})


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        ("not per-query values", TypeError, "PerQueryValues"),
        ("another metric", ValueError, "'precision_at_1'"),
        ("too few values", ValueError, "3 values for 4 query indices"),
        ("indices past the query", ValueError, "up to 13"),
    ],
)
def test_unusable_per_query_values_are_refused_by_name(kind, error, words):
    x, labels = torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(error) as caught:
        find_worst_queries(x, labels, per_query=_bad_per_query(kind))
    assert "'per_query' parameter of find_worst_queries" in str(caught.value)
    assert words in str(caught.value)
