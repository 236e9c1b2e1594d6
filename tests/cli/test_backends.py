"""``pml-eval backends`` lists every backend, including broken ones, without crashing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytorch_metric_learning import __version__
from pytorch_metric_learning.cli._backend_check import kmeans_problem, knn_problem
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


def ok_line_of(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name))


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
        "advice": "",
    }


def test_broken_plugin_is_shown_with_its_error(cli, fake_plugins: Path) -> None:
    _install_fakes(fake_plugins)
    result = cli("backends")
    assert result.code == 0
    broken_line = next(line for line in result.out.splitlines() if line.startswith("fake_broken"))
    assert "fake-broken-plugin" in broken_line
    assert "0.4.2" in broken_line
    assert "not ok (ImportError: needs libfoo.so)" in broken_line
    unchecked = cli("backends", "--no-check")
    assert ok_line_of(unchecked.out, "fake_ok").split()[1:] == ["fake-ok-plugin", "1.2.3", "ok"]
    assert "fake_means" in result.out.split("k-means backends")[1]
    assert "backend(s) not ok" in result.err.splitlines()[-1]
    assert "the search failed: NotImplementedError" in ok_line_of(result.out, "fake_ok")


def test_misspelled_entry_point_keeps_the_registry_advice(cli, fake_plugins: Path) -> None:
    typo = "[pytorch_metric_learning.knn_backends]\nfake_typo = fake_pml_ok:Backnd\n"
    add_distribution(
        fake_plugins, "fake-typo-plugin", "0.1.0", typo, {"fake_pml_ok": WORKING_SOURCE}
    )
    result = cli("backends")
    assert result.code == 0
    assert ok_line_of(result.out, "fake_typo").split()[3:5] == ["not", "ok"]
    advice = next(line for line in result.err.splitlines() if line.startswith("fake_typo: "))
    assert "Backnd" in advice and "fake-typo-plugin" in advice
    assert "Reinstall" not in advice


def test_statuses_as_data(fake_plugins: Path) -> None:
    _install_fakes(fake_plugins)
    rows = {row.name: row for row in backend_statuses("knn")}
    assert rows["fake_broken"].status == "not ok"
    assert rows["fake_broken"].error == "ImportError: needs libfoo.so"
    assert rows["fake_ok"].status == "not ok"  # imports, but raises when searching
    unchecked = {row.name: row for row in backend_statuses("knn", check=False)}
    assert unchecked["fake_ok"].status == "ok" and unchecked["fake_ok"].error == ""
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
    assert "not ok (ImportError: needs libfoo.so)" in result.out
    assert "Traceback" not in result.err


# The contract checks, on hand-made backends that each break one rule.


def _exact(query, k, reference=None, ref_includes_query=False):
    """A correct brute-force backend (plain loops over torch.cdist)."""
    reference = query if reference is None else reference
    distances = torch.cdist(query, reference)
    if ref_includes_query:
        distances[torch.arange(len(query)), torch.arange(len(query))] = float("inf")
    values, indices = torch.sort(distances, dim=1)
    return values[:, :k], indices[:, :k]


def _keeps_self(query, k, reference=None, ref_includes_query=False):
    return _exact(query, k, reference, False)


def _unsorted(query, k, reference=None, ref_includes_query=False):
    distances, indices = _exact(query, k, reference, ref_includes_query)
    return distances.flip(1), indices.flip(1)


def _numpy(query, k, reference=None, ref_includes_query=False):
    return tuple(part.numpy() for part in _exact(query, k, reference, ref_includes_query))


def _padded(query, k, reference=None, ref_includes_query=False):
    distances, indices = _exact(query, k, reference, ref_includes_query)
    indices[:, -1] = -1
    return distances, indices


def _one_too_many(query, k, reference=None, ref_includes_query=False):
    return _exact(query, k + 1, reference, False)


def _int32(query, k, reference=None, ref_includes_query=False):
    distances, indices = _exact(query, k, reference, ref_includes_query)
    return distances, indices.int()


def _raises(query, k, reference=None, ref_includes_query=False):
    raise RuntimeError("index not trained")


class _Similarities:
    """Largest first, and says so: a correct inverted backend."""

    is_inverted = True

    def __call__(self, query, k, reference=None, ref_includes_query=False):
        distances, indices = _exact(query, k, reference, ref_includes_query)
        return -distances, indices


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        (_exact, ""),
        (_Similarities(), ""),
        (_keeps_self, "containing its own index 0 in a self-search"),
        (_unsorted, "rows not sorted nearest first"),
        (_numpy, "must return torch tensors"),
        (_padded, "-1 indices in 5 rows: faiss-style padding"),
        (_one_too_many, "The width is k + 1"),
        (_int32, "indices of dtype torch.long. Got torch.int32"),
        (_raises, "the search failed: RuntimeError: index not trained"),
    ],
)
def test_knn_contract_checks(backend, problem: str) -> None:
    found = knn_problem(backend)
    assert (problem in found) if problem else found == ""


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        (lambda x, n: (x[:, 0] > 5).long(), ""),
        (lambda x, n: (x[:, 0] > 5).int(), "torch.int32 of shape (20,)"),
        (lambda x, n: torch.zeros(19, dtype=torch.long), "of shape (19,)"),
        (lambda x, n: torch.full((20,), 2), "cluster ids [2] for 2 clusters"),
        (lambda x, n: [0] * 20, "returned list"),
    ],
)
def test_kmeans_contract_checks(backend, problem: str) -> None:
    found = kmeans_problem(backend)
    assert (problem in found) if problem else found == ""


def test_a_plugin_that_keeps_self_matches_is_not_ok(cli, fake_plugins: Path) -> None:
    source = "import torch\n\nclass Backend:\n" + "".join(
        "    " + line + "\n"
        for line in [
            "def __call__(self, query, k, reference=None, ref_includes_query=False):",
            "    reference = query if reference is None else reference",
            "    values, indices = torch.cdist(query, reference).sort(dim=1)",
            "    return values[:, :k], indices[:, :k]",
        ]
    )
    entry = "[pytorch_metric_learning.knn_backends]\nfake_self = fake_pml_self:Backend\n"
    add_distribution(fake_plugins, "fake-self-plugin", "0.1", entry, {"fake_pml_self": source})
    line = ok_line_of(cli("backends").out, "fake_self")
    assert (
        "not ok (The k-NN backend 'fake_self' (Backend) returned row 0 containing its own" in line
    )
