"""``pml-eval evaluate`` on files of every format, checked against the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.evaluation import CustomKNN, list_knn_backends
from pytorch_metric_learning.evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.evaluation.search._install_hint import plugin_install_hint

from .conftest import assert_one_error
from .test_loaders import write

FORMATS = [".npy", ".npz", ".pt", ".csv"]


@pytest.fixture
def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 4, 60)
    query = (rng.normal(size=(60, 6)) + labels[:, None]).astype(np.float32)
    reference_labels = np.repeat(np.arange(5), 8)  # class 4 has no query; lone queries none
    reference = (rng.normal(size=(40, 6)) + reference_labels[:, None]).astype(np.float32)
    return {
        "query": query,
        "labels": labels,
        "reference": reference,
        "ref_labels": reference_labels,
    }


def _json(result) -> dict:
    assert result.code == 0, result.err
    return json.loads(result.out)


def brute_force_precision_at_1(query, labels, reference=None, reference_labels=None) -> float:
    """Nearest neighbour by a plain loop (leave-one-out when there is no reference)."""
    leave_one_out = reference is None
    reference = query if leave_one_out else reference
    reference_labels = labels if leave_one_out else reference_labels
    hits = []
    for i, q in enumerate(query):
        best, best_j = float("inf"), -1
        for j, r in enumerate(reference):
            if leave_one_out and i == j:
                continue
            d = float(((q.astype(np.float64) - r) ** 2).sum())
            if d < best:
                best, best_j = d, j
        hits.append(reference_labels[best_j] == labels[i])
    return float(np.mean(hits))


@pytest.mark.parametrize("suffix", FORMATS)
def test_leave_one_out_matches_the_api(cli, tmp_path: Path, data, suffix: str) -> None:
    query = write(tmp_path / f"q{suffix}", data["query"])
    labels = write(tmp_path / f"l{suffix}", data["labels"])
    record = _json(cli("evaluate", query, "--labels", labels, "--output", "-"))
    expected = AccuracyCalculator().get_accuracy(
        torch.from_numpy(data["query"]), torch.from_numpy(data["labels"])
    )
    assert record["metrics"] == pytest.approx(expected)
    assert record["metrics"]["precision_at_1"] == pytest.approx(
        brute_force_precision_at_1(data["query"], data["labels"])
    )


@pytest.mark.parametrize("suffix", FORMATS)
def test_with_a_reference_matches_the_api(cli, tmp_path: Path, data, suffix: str) -> None:
    paths = {name: write(tmp_path / f"{name}{suffix}", array) for name, array in data.items()}
    record = _json(
        cli(
            "evaluate", paths["query"], "--labels", paths["labels"],
            "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
            "--metrics", "precision_at_1,r_precision,mean_reciprocal_rank", "--k", "12",
            "--output", "-",
        )
    )  # fmt: skip
    expected = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_reciprocal_rank"), k=12
    ).get_accuracy(
        torch.from_numpy(data["query"]),
        torch.from_numpy(data["labels"]),
        torch.from_numpy(data["reference"]),
        torch.from_numpy(data["ref_labels"]),
    )
    assert record["metrics"] == pytest.approx(expected)
    assert record["metrics"]["precision_at_1"] == pytest.approx(
        brute_force_precision_at_1(
            data["query"], data["labels"], data["reference"], data["ref_labels"]
        )
    )
    settings = record["settings"]
    assert settings["k"] == 12
    assert settings["num_queries"] == 60 and settings["num_references"] == 40
    assert settings["ref_includes_query"] is False
    assert settings["metrics"] == ["mean_reciprocal_rank", "precision_at_1", "r_precision"]


def test_one_npz_holds_everything(cli, tmp_path: Path, data) -> None:
    path = tmp_path / "all.npz"
    np.savez(
        path,
        embeddings=data["query"],
        labels=data["labels"],
        ref=data["reference"],
        rl=data["ref_labels"],
    )
    record = _json(
        cli("evaluate", path, "--labels", path, "--reference", f"{path}:ref",
            "--reference-labels", f"{path}:rl", "--metrics", "precision_at_1", "--output", "-")
    )  # fmt: skip
    assert record["metrics"]["precision_at_1"] == pytest.approx(
        brute_force_precision_at_1(
            data["query"], data["labels"], data["reference"], data["ref_labels"]
        )
    )


def test_class_names_share_one_numbering(cli, tmp_path: Path, data) -> None:
    names = np.array(["ant", "bee", "cat", "dog", "eel"])
    query_csv = tmp_path / "labels.csv"
    query_csv.write_text("# species\n" + "\n".join(names[data["labels"]]) + "\n")
    reference_csv = tmp_path / "ref_labels.csv"
    reference_csv.write_text("\n".join(names[data["ref_labels"]]) + "\n")
    query = write(tmp_path / "q.npy", data["query"])
    reference = write(tmp_path / "r.npy", data["reference"])
    record = _json(
        cli("evaluate", query, "--labels", query_csv, "--reference", reference,
            "--reference-labels", reference_csv, "--per-class", "--metrics",
            "precision_at_1,r_precision", "--output", "-")
    )  # fmt: skip
    expected = AccuracyCalculator(
        include=("precision_at_1", "r_precision"), return_per_class=True
    ).get_accuracy(
        torch.from_numpy(data["query"]),
        torch.from_numpy(data["labels"]),
        torch.from_numpy(data["reference"]),
        torch.from_numpy(data["ref_labels"]),
    )
    assert record["metrics"]["precision_at_1"] == pytest.approx(expected["precision_at_1"])
    assert record["metrics"]["r_precision"] == pytest.approx(expected["r_precision"])
    assert record["classes"] == ["ant", "bee", "cat", "dog"]  # eel has no query


def test_per_class_table(cli, tmp_path: Path) -> None:
    query = write(
        tmp_path / "q.npy", np.array([[0.0], [0.1], [5.0], [5.2], [9.0]], dtype=np.float32)
    )
    labels = write(tmp_path / "l.npy", np.array([3, 3, 8, 8, 9]))
    result = cli(
        "evaluate", query, "--labels", labels, "--per-class", "--metrics", "precision_at_1"
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("class"))) :]
    assert table[0].split() == ["class", "precision_at_1"]
    assert [line.split() for line in table[2:]] == [["3", "1.0000"], ["8", "1.0000"]]


def test_knn_spec_as_json(cli, tmp_path: Path, data) -> None:
    query = write(tmp_path / "q.npy", data["query"])
    labels = write(tmp_path / "l.npy", data["labels"])
    spec = '{"name": "custom", "distance": "cosine", "batch_size": 7}'
    record = _json(cli("evaluate", query, "--labels", labels, "--knn", spec,
                       "--metrics", "precision_at_1,mean_average_precision_at_r", "--output", "-"))  # fmt: skip
    expected = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r"),
        knn_func=CustomKNN(CosineSimilarity(), batch_size=7),
    ).get_accuracy(torch.from_numpy(data["query"]), torch.from_numpy(data["labels"]))
    assert record["metrics"] == pytest.approx(expected)
    knn = record["settings"]["knn"]
    assert knn["spec"] == {"name": "custom", "distance": "cosine", "batch_size": 7}
    assert knn["name"] == "custom" and knn["distribution"] == "pytorch-metric-learning"
    assert "CosineSimilarity" in knn["repr"] and "batch_size=7" in knn["repr"]


def test_settings_record_the_defaults(cli, tmp_path: Path, data) -> None:
    query = write(tmp_path / "q.npy", data["query"])
    labels = write(tmp_path / "l.npy", data["labels"])
    out = tmp_path / "results" / "metrics.json"
    result = cli("evaluate", query, "--labels", labels, "--output", out)
    assert result.code == 0, result.err
    assert "precision_at_1" in result.out  # the table is still printed
    record = json.loads(out.read_text())
    assert record["settings"]["knn"]["name"] == "custom"
    assert record["settings"]["kmeans"]["name"] == "torch"
    assert record["settings"]["k"] is None
    assert record["settings"]["ref_includes_query"] is True
    assert record["versions"]["torch"] == torch.__version__
    assert record["command"][:2] == ["pml-eval", "evaluate"]


def test_table_output(cli, tmp_path: Path, data) -> None:
    query = write(tmp_path / "q.npy", data["query"])
    labels = write(tmp_path / "l.npy", data["labels"])
    result = cli("evaluate", query, "--labels", labels, "--metrics", "precision_at_1")
    assert result.code == 0, result.err
    assert "60 queries of 6 dims" in result.out
    row = next(line for line in result.out.splitlines() if line.startswith("precision_at_1"))
    value = brute_force_precision_at_1(data["query"], data["labels"])
    assert row.split() == ["precision_at_1", f"{value:.4f}"]


def _files(tmp_path: Path, data) -> dict[str, Path]:
    return {
        "q": write(tmp_path / "q.npy", data["query"]),
        "l": write(tmp_path / "l.npy", data["labels"]),
        "r": write(tmp_path / "r.npy", data["reference"]),
        "rl": write(tmp_path / "rl.npy", data["ref_labels"]),
        "narrow": write(tmp_path / "narrow.npy", data["reference"][:, :3]),
        "vector": write(tmp_path / "vector.npy", data["labels"].astype(np.float32)),
    }


def _evaluate(*options: str) -> tuple[str, ...]:
    return ("evaluate", "{q}", "--labels", "{l}", *options)


ERRORS = [
    (
        ("evaluate", "missing.npy", "--labels", "{l}"),
        1,
        "The embeddings file 'missing.npy' does not exist.",
    ),
    (
        ("evaluate", "{vector}", "--labels", "{l}"),
        1,
        "must be a 2-D array (rows, dims). Got shape (60,) instead.",
    ),
    (("evaluate", "{q}", "--labels", "{rl}"), 1, "have 40 rows but the data they label has 60"),
    (
        (
            "evaluate",
            "{q}",
            "--labels",
            "{l}",
            "--reference",
            "{narrow}",
            "--reference-labels",
            "{rl}",
        ),
        1,
        "have 3 columns but those in",
    ),
    (
        _evaluate("--knn", "no-such-backend"),
        3,
        "Unknown knn backend 'no-such-backend'. Installed backends:",
    ),
    (_evaluate("--kmeans", "no-such-backend"), 3, "Unknown kmeans backend 'no-such-backend'"),
    (_evaluate("--knn", "{{oops"), 2, "The --knn option is not valid JSON"),
    (_evaluate("--knn", '{{"distance": "cosine"}}'), 2, 'a JSON object with a "name"'),
    (
        _evaluate("--knn", '{{"name": "custom", "bogus": 1}}'),
        1,
        "Unknown option ['bogus'] for the knn backend 'custom'",
    ),
    (
        _evaluate("--reference", "{r}"),
        2,
        "--reference and --reference-labels must be given together",
    ),
    (_evaluate("--ref-includes-query"), 2, "--ref-includes-query needs --reference"),
    (_evaluate("--k", "0"), 2, "argument --k: must be a positive int, max_bin_count or all"),
    (_evaluate("--metrics", "precision_at_0"), 2, "unknown metric 'precision_at_0'"),
    (("evaluate", "{q}"), 2, "the following arguments are required: --labels"),
    (_evaluate("--device", "banana"), 2, "argument --device: must be a torch device"),
    (_evaluate("--device", "meta"), 2, "argument --device: cannot compute on 'meta'"),
    (
        _evaluate("--kmeans", "[1]"),
        2,
        "argument --kmeans: The --kmeans option must be a backend name or a JSON object",
    ),
    (
        _evaluate("--per-class", "--avg-of-avgs"),
        2,
        "argument --avg-of-avgs: not allowed with argument --per-class",
    ),
]


@pytest.mark.parametrize(("argv", "code", "message"), ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors(cli, tmp_path: Path, data, argv, code: int, message: str) -> None:
    files = _files(tmp_path, data)
    result = cli(*(arg.format(**files) for arg in argv))
    assert_one_error(result, code, message)


@pytest.mark.skipif("faiss" in list_knn_backends(), reason="the faiss plugin is installed")
def test_faiss_not_installed(cli, tmp_path: Path, data) -> None:
    files = _files(tmp_path, data)
    result = cli("evaluate", files["q"], "--labels", files["l"], "--knn", '{"name": "faiss"}')
    assert result.code == 3
    assert plugin_install_hint("faiss") in result.err  # the hint itself: test_install_hint.py


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_device_without_cuda(cli, tmp_path: Path, data) -> None:
    files = _files(tmp_path, data)
    result = cli("evaluate", files["q"], "--labels", files["l"], "--device", "cuda")
    assert result.code == 2
    assert "CUDA is not available" in result.err


def test_a_backend_name_two_distributions_claim_exits_3(
    cli, tmp_path: Path, data, fake_plugins
) -> None:
    from .conftest import add_distribution, error_line

    source = "class Backend:\n    def __call__(self, query, k, reference=None, ref_includes_query=False):\n        raise NotImplementedError\n"
    for name in ("fake-claim-one", "fake-claim-two"):
        module = name.replace("-", "_").replace("fake", "fake_pml")
        entry = f"[pytorch_metric_learning.knn_backends]\nclaimed = {module}:Backend\n"
        add_distribution(fake_plugins, name, "0.1", entry, {module: source})
    files = _files(tmp_path, data)
    result = cli("evaluate", files["q"], "--labels", files["l"], "--knn", "claimed")
    assert result.code == 3
    line = error_line(result.err)
    assert "fake-claim-one" in line and "fake-claim-two" in line
