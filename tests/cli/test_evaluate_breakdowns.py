"""``pml-eval evaluate --query-categories`` and ``--show-worst``, checked against the API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation import AccuracyCalculator
from pytorch_metric_learning.worst_queries import find_worst_queries

from .conftest import assert_one_error
from .test_loaders import write

METRICS = "precision_at_1,recall_at_2,mean_average_precision_at_r"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 6, 50)
    query = (rng.normal(size=(50, 5)) + 0.7 * labels[:, None]).astype(np.float32)
    categories = np.array(["round", "straight", "mixed"])[labels % 3]
    return {
        "query": write(tmp_path / "q.npy", query),
        "labels": write(tmp_path / "y.csv", labels),
        "categories": write(tmp_path / "c.csv", categories),
    }


def _arrays(files):
    query = torch.from_numpy(np.load(files["query"]))
    labels = torch.from_numpy(np.loadtxt(files["labels"], dtype=np.int64))
    categories = np.loadtxt(files["categories"], dtype=str).tolist()
    return query, labels, categories


def test_categories_in_json_and_table_equal_the_api(cli, files, tmp_path):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"],
        "--query-categories", files["categories"], "--metrics", METRICS, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    query, labels, categories = _arrays(files)
    calc = AccuracyCalculator(include=tuple(METRICS.split(",")))
    expected = calc.get_accuracy(query, labels, query_categories=categories)["per_category"]
    assert list(record["per_category"]) == ["mixed", "round", "straight"]
    for name, values in expected.items():
        assert record["per_category"][name] == pytest.approx(values)
    assert "per_category" not in record["metrics"]
    assert record["settings"]["query_categories"] == str(files["categories"])
    table = result.out.split("category")[1]
    assert "straight" in table and f"{expected['round']['precision_at_1']:.4f}" in table
    assert f"round     {categories.count('round')}" in table


def test_worst_queries_table_and_json_equal_the_api(cli, files, tmp_path):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--show-worst", 3,
        "--worst-metric", "recall_at_2", "--worst-k", 4, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    query, labels, _ = _arrays(files)
    expected = find_worst_queries(query, labels, metric="recall_at_2", num_queries=3, k=4)
    record = json.loads(out.read_text())["worst_queries"]
    assert record["metric"] == "recall_at_2"
    assert [q["index"] for q in record["queries"]] == [w.index for w in expected]
    assert record["queries"][0]["retrievals"] == [
        {"rank": r.rank, "index": r.index, "label": r.label, "distance": r.distance,
         "relevant": r.relevant}
        for r in expected[0].retrievals
    ]  # fmt: skip
    assert "The 3 worst queries by recall_at_2" in result.out


def test_the_plot_is_written_from_an_image_list(cli, files, tmp_path):
    matplotlib_image = pytest.importorskip("matplotlib.image")
    (tmp_path / "img").mkdir()
    for i in range(50):
        matplotlib_image.imsave(tmp_path / "img" / f"{i}.png", np.full((6, 6), i / 50))
    paths = tmp_path / "paths.txt"
    paths.write_text("".join(f"img/{i}.png\n" for i in range(50)))
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--show-worst", 2,
        "--images", paths, "--plot", tmp_path / "worst.png",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert matplotlib_image.imread(tmp_path / "worst.png").shape[1] > 500
    assert "Plot written to" in result.out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--plot", "w.png"], "--plot belongs to --show-worst N"),
        (["--show-worst", "2", "--plot", "w.png"], "--images and --plot must be given together"),
        (["--show-worst", "0"], "argument --show-worst: must be a positive int"),
        (
            ["--show-worst", "2", "--images", "p.txt", "--plot", "w.jpg"],
            "its file name must end in .png",
        ),
        (["--show-worst", "2", "--worst-metric", "NMI"], "a k-NN metric with a value per query"),
        (["--query-categories", "LABELS", "--per-class"], "cannot be combined with --per-class"),
    ],
)
def test_misused_options_are_one_usage_error(cli, files, tmp_path, extra, message):
    extra = [str(files["labels"]) if item == "LABELS" else item for item in extra]
    result = cli("evaluate", files["query"], "--labels", files["labels"], *extra)
    assert_one_error(result, 2, message)


def test_a_category_file_of_the_wrong_length_is_an_input_error(cli, files, tmp_path):
    short = write(tmp_path / "short.csv", np.arange(10))
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--query-categories", short
    )
    assert result.code != 0 and "short.csv" in result.err and result.out == ""


def test_an_image_list_of_the_wrong_length_is_an_input_error(cli, files, tmp_path):
    pytest.importorskip("matplotlib")
    paths = tmp_path / "paths.txt"
    paths.write_text("a.png\n")
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--show-worst", 2,
        "--images", paths, "--plot", tmp_path / "w.png",
    )  # fmt: skip
    assert result.code != 0 and "one image per embedding row (50)" in result.err
    assert result.out == ""
    assert not (tmp_path / "w.png").exists()


def test_ci_method_choices_are_the_api_methods():
    from pytorch_metric_learning.cli.parsers.evaluate import CI_METHODS
    from pytorch_metric_learning.evaluation.retrieval.bootstrap import METHODS

    assert CI_METHODS == METHODS


@pytest.mark.parametrize(
    "method, expected", [("auto", "clopper_pearson"), ("percentile", "percentile")]
)
def test_ci_method_chooses_the_interval_of_zero_one_metrics(cli, files, tmp_path, method, expected):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--metrics", METRICS,
        "--ci", 95, "--ci-method", method, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    assert record["intervals"]["recall_at_2"]["method"] == expected
    assert record["intervals"]["mean_average_precision_at_r"]["method"] == "percentile"
    assert record["settings"]["bootstrap"]["method"] == method
    assert ("Clopper-Pearson" in result.out) == (method == "auto")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ci-method", "percentile"], "--ci-method chooses how --ci makes intervals"),
        (
            ["--ci", "95", "--ci-method", "clopper_pearson"],
            "mean_average_precision_at_r, r_precision are not",
        ),
        (
            ["--ci", "95", "--ci-method", "clopper_pearson", "--metrics", METRICS],
            "mean_average_precision_at_r is not",
        ),
        (
            [
                "--ci",
                "95",
                "--ci-method",
                "clopper_pearson",
                "--metrics",
                "recall_at_1",
                "--ci-by-class",
            ],
            "cannot be combined with --ci-by-class",
        ),
    ],
)
def test_ci_method_mistakes_are_usage_errors_before_any_search(
    cli, files, extra, message, monkeypatch
):
    def no_search(*args, **kwargs):
        raise AssertionError("the search ran before the options were checked")

    monkeypatch.setattr(AccuracyCalculator, "get_accuracy", no_search)
    result = cli("evaluate", files["query"], "--labels", files["labels"], *extra)
    assert_one_error(result, 2, message)


def test_clopper_pearson_on_zero_one_metrics_runs(cli, files, tmp_path):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--metrics",
        "precision_at_1,recall_at_2,AMI", "--ci", 95, "--ci-method", "clopper_pearson",
        "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    assert {found["method"] for found in record["intervals"].values()} == {"clopper_pearson"}


@pytest.mark.parametrize(
    "distance, kind",
    [("euclidean", "distance"), ("cosine", "similarity"), ("dot_product", "similarity")],
)
def test_worst_queries_name_the_kind_of_distance_and_their_settings(
    cli, files, tmp_path, distance, kind
):
    out = tmp_path / "out.json"
    spec = json.dumps({"name": "custom", "distance": distance})
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--knn", spec,
        "--show-worst", 1, "--worst-metric", "recall_at_2", "--worst-k", 3, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    record = json.loads(out.read_text())
    worst = record["worst_queries"]
    assert (worst["metric"], worst["k"], worst["distance_kind"]) == ("recall_at_2", 3, kind)
    settings = record["settings"]
    assert (settings["show_worst"], settings["worst_metric"], settings["worst_k"]) == (
        1,
        "recall_at_2",
        3,
    )
    header = next(line for line in result.out.splitlines() if line.startswith("query "))
    assert kind in header.split() and "recall_at_2" in header.split()
    assert "The worst query by recall_at_2" in result.out
    assert "The 1 worst" not in result.out


def test_category_table_marks_wrong_metrics_and_json_counts_queries(cli, files, tmp_path):
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", files["query"], "--labels", files["labels"], "--query-categories",
        files["categories"], "--metrics", METRICS, "--k", 2, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    overall, categories = result.out.split("\ncategory")
    assert "mean_average_precision_at_r (!)" in overall
    header = categories.splitlines()[0]
    assert "mean_average_precision_at_r (!)" in header and "precision_at_1 (!)" not in header
    assert "(!) wrong" in categories
    _, _, names = _arrays(files)
    record = json.loads(out.read_text())
    assert record["per_category_queries"] == {name: names.count(name) for name in set(names)}


def test_worst_queries_when_every_query_is_left_out(cli, tmp_path):
    """No query label among the reference labels: no worst query to show, said in words,
    and the JSON records the k and metric that were asked for."""
    rng = np.random.default_rng(0)
    paths = {
        "q": write(tmp_path / "q.npy", rng.normal(size=(6, 3)).astype(np.float32)),
        "ql": write(tmp_path / "ql.npy", np.full(6, 9)),
        "r": write(tmp_path / "r.npy", rng.normal(size=(8, 3)).astype(np.float32)),
        "rl": write(tmp_path / "rl.npy", np.arange(8) % 3),
    }
    out = tmp_path / "out.json"
    result = cli(
        "evaluate", paths["q"], "--labels", paths["ql"], "--reference", paths["r"],
        "--reference-labels", paths["rl"], "--metrics", "precision_at_1",
        "--show-worst", 3, "--output", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "No worst queries by precision_at_1: every query was left out" in result.out
    record = json.loads(out.read_text())["worst_queries"]
    assert record == {
        "metric": "precision_at_1", "k": 5, "distance_kind": record["distance_kind"],
        "value_kind": None, "value_name": "precision_at_1", "single_shot_draws": None,
        "rank": "rank", "note": None, "queries": [],
    }  # fmt: skip
