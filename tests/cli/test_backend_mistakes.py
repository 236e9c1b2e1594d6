"""Issue 32 through the CLI: installed plugins that each make one mistake.

Each mistake is a fake installed distribution (a ``.dist-info`` on ``sys.path`` whose
entry point names a class of tests/fakes/knn_mistakes.py, copied in as a module):
``pml-eval backends --check`` lists it ``not ok`` naming the mistake, ``pml-eval evaluate``
refuses it with the backend's exit code, and plugins that misbehave at import (print,
``SystemExit``, ``KeyboardInterrupt``, an import that never ends) cannot end, stall or
corrupt the listing.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning.cli.app import EXIT_BACKEND

from .conftest import add_distribution

FAKES = (Path(__file__).parents[1] / "fakes" / "knn_mistakes.py").read_text(encoding="utf-8")

# entry-point name -> (class in knn_mistakes, what the listing must say)
MISTAKES = {
    "m_ascending": ("AscendingSimilarities", "ascending similarities"),
    "m_sorted_copy": ("SortedCopyIndices", "indices of another ordering"),
    "m_wrong_metric": ("WrongMetric", "wrong metric"),
    "m_undeclared": ("UndeclaredApproximate", "declare is_exact = False"),
    "m_threaded": ("ThreadedApproximate", "different distances or neighbours"),
    "m_in_place": ("ModifiesInputs", "modified its inputs"),
    "m_raises": ("RaisesInSearch", "HNSW graph corrupted"),
    "m_usearch": ("UsearchPadding", "usearch-style padding"),
    "m_pynndescent": ("PynndescentPadding", "pynndescent-style"),
}


def _install_mistakes(folder: Path) -> None:
    points = "\n".join(f"{name} = fake_pml_mistakes:{cls}" for name, (cls, _) in MISTAKES.items())
    add_distribution(
        folder,
        "fake-mistakes",
        "0.0.1",
        f"[pytorch_metric_learning.knn_backends]\n{points}\n",
        {"fake_pml_mistakes": FAKES},
    )


def _rows(result) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(result.out)["knn"]}


def test_every_mistake_is_not_ok_with_its_name(cli, fake_plugins: Path) -> None:
    _install_mistakes(fake_plugins)
    result = cli("backends", "--size", "300", "--output", "-")
    rows = _rows(result)
    assert result.code == 0
    for name, (_, said) in MISTAKES.items():
        assert rows[name]["status"] == "not ok", name
        assert said in rows[name]["error"], (name, rows[name]["error"])
    assert rows["custom"]["status"] == "ok" and rows["torch_distributed"]["status"] == "ok"


@pytest.mark.parametrize("name", ["m_ascending", "m_sorted_copy", "m_raises"])
def test_evaluate_blames_the_backend(cli, fake_plugins: Path, tmp_path: Path, name) -> None:
    _install_mistakes(fake_plugins)
    generator = np.random.default_rng(0)
    query = tmp_path / "x.npy"
    labels = tmp_path / "y.npy"
    np.save(query, generator.normal(size=(300, 8)).astype(np.float32))
    np.save(labels, generator.integers(0, 5, 300))
    spec = json.dumps({"name": name, "distance": "cosine"})
    result = cli("evaluate", query, "--labels", labels, "--knn", spec)
    assert result.code == EXIT_BACKEND
    assert name in result.err and MISTAKES[name][1] in result.err


IMPORT_MISTAKES = {
    "fake_pml_exits": ("raise SystemExit(2)\n", "raised SystemExit"),
    "fake_pml_interrupts": ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
}


def test_a_plugin_ending_the_program_at_import_is_listed_not_ok(cli, fake_plugins: Path) -> None:
    for module, (source, _) in IMPORT_MISTAKES.items():
        add_distribution(
            fake_plugins,
            module.replace("_", "-"),
            "1.0",
            f"[pytorch_metric_learning.knn_backends]\n{module} = {module}:Backend\n",
            {module: source},
        )
    result = cli("backends", "--no-check", "--output", "-")
    rows = _rows(result)
    assert result.code == 0
    for module, (_, said) in IMPORT_MISTAKES.items():
        assert rows[module]["status"] == "not ok" and said in rows[module]["advice"]
        assert f"{module}:Backend" in rows[module]["advice"]
    assert rows["custom"]["status"] == "ok"  # the listing went on


def test_a_plugin_printing_at_import_does_not_corrupt_the_json(cli, fake_plugins: Path) -> None:
    source = (
        "print('hello from the plugin')\n"
        "from pytorch_metric_learning.evaluation import CustomKNN as Backend\n"
    )
    add_distribution(
        fake_plugins,
        "fake-chatty",
        "1.0",
        "[pytorch_metric_learning.knn_backends]\nfake_pml_chatty = fake_pml_chatty:make\n",
        {
            "fake_pml_chatty": source + "from pytorch_metric_learning.distances import LpDistance\n"
            "def make():\n    print('built')\n    return Backend(LpDistance())\n"
        },
    )
    result = cli("backends", "--size", "100", "--output", "-")
    assert _rows(result)["fake_pml_chatty"]["status"] == "ok"  # json.loads succeeded
    assert "hello from the plugin" in result.err and "built" in result.err


def test_an_import_that_never_ends_is_given_up_after_the_limit(
    cli, fake_plugins: Path, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    source = (
        "import os, time\n"
        f"while not os.path.exists({str(release)!r}):\n"
        "    time.sleep(0.01)\n"
        "class Backend: ...\n"
    )
    add_distribution(
        fake_plugins,
        "fake-stuck",
        "1.0",
        "[pytorch_metric_learning.knn_backends]\nfake_pml_stuck = fake_pml_stuck:Backend\n",
        {"fake_pml_stuck": source},
    )
    try:
        result = cli("backends", "--no-check", "--import-timeout", "1.5", "--output", "-")
    finally:
        release.touch()  # let the abandoned import finish
        for thread in threading.enumerate():
            if thread.name.startswith("pml-load-knn-fake_pml_stuck"):
                thread.join(60)
                assert not thread.is_alive(), "the abandoned import never finished"
    row = _rows(result)["fake_pml_stuck"]
    assert row["status"] == "not ok" and row["error"] == "import took longer than 1.5 s"
    assert "loading 'fake_pml_stuck'" in result.err  # named while it stalled
    assert _rows(result)["custom"]["status"] == "ok"


@pytest.mark.faiss
def test_an_approximate_faiss_index_is_reported_with_its_recall(cli, tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    generator = np.random.default_rng(0)
    centers = 3 * generator.normal(size=(10, 8))
    labels = generator.integers(0, 10, 600)
    np.save(tmp_path / "x.npy", (centers[labels] + generator.normal(size=(600, 8))).astype("f4"))
    np.save(tmp_path / "y.npy", labels)
    spec = json.dumps({"name": "faiss", "index": "HNSW32", "efSearch": 256})
    files = (tmp_path / "x.npy", "--labels", tmp_path / "y.npy", "--knn", spec)
    table = cli("evaluate", *files)
    assert table.code == 0 and "figures come from an approximate k-NN index" in table.out
    assert "recall@" in table.out
    knn = json.loads(cli("evaluate", *files, "--output", "-").out)["settings"]["knn"]
    assert knn["exact"] is False and 0.0 < knn["approximate"]["recall"] <= 1.0
    flat = json.loads(cli("evaluate", *files[:3], "--knn", "faiss", "--output", "-").out)
    assert flat["settings"]["knn"]["exact"] is True and "approximate" not in flat["settings"]["knn"]
