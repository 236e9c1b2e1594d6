"""``pml-eval backends`` lists every backend, including broken ones, without crashing."""

from __future__ import annotations

import json
from pathlib import Path

from pytorch_metric_learning import __version__
from pytorch_metric_learning.cli.backends import backend_statuses
from pytorch_metric_learning.evaluation import list_kmeans_backends, list_knn_backends

from .conftest import add_distribution, run_subprocess

BROKEN = """
[pytorch_metric_learning.knn_backends]
fake_broken = fake_pml_broken:Backend
"""
WORKING = """
[pytorch_metric_learning.knn_backends]
fake_ok = fake_pml_ok:Backend

[pytorch_metric_learning.kmeans_backends]
fake_means = fake_pml_ok:Means
"""
WORKING_SOURCE = """
class Backend:
    def __call__(self, query, k, reference=None, ref_includes_query=False):
        raise NotImplementedError

class Means:
    def __call__(self, x, num_clusters):
        raise NotImplementedError
"""


def _install_fakes(folder: Path) -> None:
    add_distribution(
        folder,
        "fake-broken-plugin",
        "0.4.2",
        BROKEN,
        {"fake_pml_broken": "raise ImportError('needs libfoo.so')\n"},
    )
    add_distribution(folder, "fake-ok-plugin", "1.2.3", WORKING, {"fake_pml_ok": WORKING_SOURCE})


def test_lists_every_registered_name(cli) -> None:
    result = cli("backends", "--output", "-")
    listing = json.loads(result.out)
    assert result.code == 0
    assert [row["name"] for row in listing["knn"]] == list_knn_backends()
    assert [row["name"] for row in listing["kmeans"]] == list_kmeans_backends()


def test_core_backend_row(cli) -> None:
    result = cli("backends", "--output", "-")
    custom = next(row for row in json.loads(result.out)["knn"] if row["name"] == "custom")
    assert custom == {
        "kind": "knn",
        "name": "custom",
        "distribution": "pytorch-metric-learning",
        "version": __version__,
        "status": "ok",
        "error": "",
    }


def test_broken_plugin_is_shown_with_its_error(cli, fake_plugins: Path) -> None:
    _install_fakes(fake_plugins)
    result = cli("backends")
    assert result.code == 0
    broken_line = next(line for line in result.out.splitlines() if line.startswith("fake_broken"))
    assert "fake-broken-plugin" in broken_line
    assert "0.4.2" in broken_line
    assert "broken (ImportError: needs libfoo.so)" in broken_line
    ok_line = next(line for line in result.out.splitlines() if line.startswith("fake_ok"))
    assert ok_line.split()[1:] == ["fake-ok-plugin", "1.2.3", "ok"]
    assert "fake_means" in result.out.split("k-means backends")[1]
    assert "failed to import" in result.err


def test_statuses_as_data(fake_plugins: Path) -> None:
    _install_fakes(fake_plugins)
    rows = {row.name: row for row in backend_statuses("knn")}
    assert rows["fake_broken"].status == "broken"
    assert rows["fake_broken"].error == "ImportError: needs libfoo.so"
    assert rows["fake_ok"].status == "ok" and rows["fake_ok"].error == ""
    assert "fake_means" in [row.name for row in backend_statuses("kmeans")]


def test_json_file_output(cli, tmp_path: Path) -> None:
    destination = tmp_path / "out" / "backends.json"
    result = cli("backends", "--output", destination)
    assert result.code == 0
    assert "k-NN backends" in result.out
    assert "custom" in {row["name"] for row in json.loads(destination.read_text())["knn"]}


def test_broken_plugin_in_a_fresh_process(tmp_path: Path) -> None:
    _install_fakes(tmp_path)
    result = run_subprocess("backends", env={"PYTHONPATH": str(tmp_path)})
    assert result.code == 0
    assert "broken (ImportError: needs libfoo.so)" in result.out
    assert "Traceback" not in result.err
