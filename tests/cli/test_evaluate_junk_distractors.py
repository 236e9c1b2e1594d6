"""``pml-eval evaluate --junk-labels ... --distractor-labels ...``: Market-1501 label files
(-1 junk, 0 distractor) give the numbers of the API's ``junk_labels``/``distractor_labels``,
for integer and for name labels; a value of another type than the labels', or one in both
lists, is refused (exit 2) before any search.

The oracle is ``get_accuracy`` on the same arrays with the label values written here, and
a plain count of the candidates in the test for what junk and distractors change.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation import AccuracyCalculator

from .conftest import assert_one_error
from .test_loaders import write

METRICS = ("recall_at_1", "recall_at_3", "mean_average_precision", "mean_inverse_negative_penalty")


def _market(seed: int):
    rng = np.random.default_rng(seed)
    query_ids = rng.integers(0, 5, 25)  # a query of identity 0 has no relevant item
    gallery_ids = rng.integers(-1, 5, 70)
    centres = rng.normal(size=(6, 4))
    query = centres[query_ids + 1] + rng.normal(size=(25, 4))
    gallery = centres[gallery_ids + 1] + rng.normal(size=(70, 4))
    return {
        "query": query.astype(np.float64),
        "query_ids": query_ids,
        "gallery": gallery.astype(np.float64),
        "gallery_ids": gallery_ids,
        "query_cams": rng.integers(0, 3, 25),
        "gallery_cams": rng.integers(0, 3, 70),
    }


def _files(tmp_path, data, names: bool):
    as_labels = (lambda ids: np.array([f"id{i}" for i in ids])) if names else (lambda ids: ids)
    return {
        "query": write(tmp_path / "q.npy", data["query"]),
        "query_ids": write(tmp_path / "qy.csv", as_labels(data["query_ids"])),
        "gallery": write(tmp_path / "g.npy", data["gallery"]),
        "gallery_ids": write(tmp_path / "gy.csv", as_labels(data["gallery_ids"])),
        "query_cams": write(tmp_path / "qc.csv", data["query_cams"]),
        "gallery_cams": write(tmp_path / "gc.csv", data["gallery_cams"]),
    }


def _run(cli, files, tmp_path, *extra):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["query_ids"],
        "--reference", files["gallery"], "--reference-labels", files["gallery_ids"],
        "--query-groups", files["query_cams"], "--reference-groups", files["gallery_cams"],
        "--metrics", ",".join(METRICS), "--k", "all", "--output", out, *extra,
    )  # fmt: skip
    assert result.code == 0, result.err
    return json.loads(out.read_text())


def _api(data, junk, distractors):
    calculator = AccuracyCalculator(include=METRICS, k=None)
    found = calculator.get_accuracy(
        torch.from_numpy(data["query"]),
        torch.from_numpy(data["query_ids"]),
        torch.from_numpy(data["gallery"]),
        torch.from_numpy(data["gallery_ids"]),
        query_groups=torch.from_numpy(data["query_cams"]),
        reference_groups=torch.from_numpy(data["gallery_cams"]),
        junk_labels=junk,
        distractor_labels=distractors,
    )
    return found, calculator.last_num_queries_left_out


@pytest.mark.parametrize("names", [False, True], ids=["integer labels", "name labels"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_junk_and_distractors_from_the_command_line_equal_the_api(cli, tmp_path, seed, names):
    data = _market(seed)
    files = _files(tmp_path, data, names)
    junk, distractor = ("id-1", "id0") if names else ("-1", "0")
    record = _run(cli, files, tmp_path, "--junk-labels", junk, "--distractor-labels", distractor)
    expected, left_out = _api(data, (-1,), (0,))
    for name in METRICS:
        assert record["metrics"][name] == pytest.approx(expected[name], abs=1e-6)
    # the queries of identity 0 have no relevant item (0 is a distractor), and those whose
    # identity's gallery images all share their camera: counted by hand
    by_hand = 0
    for q in range(25):
        ident, cam = data["query_ids"][q], data["query_cams"][q]
        relevant = (data["gallery_ids"] == ident) & (data["gallery_cams"] != cam)
        by_hand += ident == 0 or not relevant.any()
    assert record["settings"]["queries_left_out"] == left_out == by_hand
    assert record["settings"]["junk_labels"] == [junk]
    assert record["settings"]["distractor_labels"] == [distractor]


def test_the_options_change_the_numbers_as_the_api_does(cli, tmp_path):
    data = _market(0)
    files = _files(tmp_path, data, names=False)
    plain = _run(cli, files, tmp_path)["metrics"]
    junk_only = _run(cli, files, tmp_path, "--junk-labels", "-1")["metrics"]
    assert plain == pytest.approx(_api(data, (), ())[0], abs=1e-6)
    assert junk_only == pytest.approx(_api(data, (-1,), ())[0], abs=1e-6)
    assert plain != junk_only  # -1 images rank among the candidates without the option


def test_whole_number_floats_are_integer_labels(cli, tmp_path):
    data = _market(1)
    files = _files(tmp_path, data, names=False)
    record = _run(cli, files, tmp_path, "--junk-labels", "-1.0", "--distractor-labels", "0")
    assert record["metrics"] == pytest.approx(_api(data, (-1,), (0,))[0], abs=1e-6)


def _no_search(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("searched before refusing")

    monkeypatch.setattr(AccuracyCalculator, "get_accuracy", refuse)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--junk-labels", "-1", "--distractor-labels", "-1"], "share -1"),
        (["--junk-labels", "-1", "0", "--distractor-labels", "0.0"], "share 0"),
        (["--junk-labels", "junk"], "--junk-labels takes labels like those of --labels"),
        (["--distractor-labels", "1.5"], "--distractor-labels takes labels like those"),
    ],
)
def test_bad_values_are_refused_before_any_search(cli, tmp_path, monkeypatch, extra, message):
    files = _files(tmp_path, _market(0), names=False)
    _no_search(monkeypatch)
    result = cli(
        "evaluate", files["query"], "--labels", files["query_ids"],
        "--reference", files["gallery"], "--reference-labels", files["gallery_ids"], *extra,
    )  # fmt: skip
    assert_one_error(result, 2, message)


def test_names_in_both_lists_are_refused(cli, tmp_path, monkeypatch):
    files = _files(tmp_path, _market(0), names=True)
    _no_search(monkeypatch)
    result = cli(
        "evaluate", files["query"], "--labels", files["query_ids"],
        "--reference", files["gallery"], "--reference-labels", files["gallery_ids"],
        "--junk-labels", "id-1", "--distractor-labels", "id-1",
    )  # fmt: skip
    assert_one_error(result, 2, "share id-1")


def test_help_names_both_options(cli):
    result = cli("evaluate", "--help")
    assert "--junk-labels" in result.out and "--distractor-labels" in result.out
