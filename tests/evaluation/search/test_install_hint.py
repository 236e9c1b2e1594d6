"""The faiss install hint fits the installation at hand (PEP 610 ``direct_url.json``)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from pytorch_metric_learning.evaluation.search._install_hint import (
    extra_install_hint,
    extra_requirements,
    plugin_install_hint,
    source_checkout,
)

ROOT = Path(__file__).resolve().parents[3]
# The interpreter running the code, not whichever ``pip`` is first on PATH.
PIP = f"{shlex.quote(sys.executable)} -m pip"
# Away from a checkout: the plugin is not on the package index, and the message says so.
UNPUBLISHED = f"{PIP} install -e CLONE/plugins/faiss (CLONE: a clone of the source repository"


def _installed(site: Path, direct_url: object | None) -> None:
    """An installed-looking core distribution in ``site``, as pip records it."""
    info = site / "pytorch_metric_learning-3.0.0.dev0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pytorch-metric-learning\nVersion: 3.0.0.dev0\n"
        "Requires-Dist: torch>=2.0\n"
        "Provides-Extra: plots\n"
        'Requires-Dist: matplotlib>=3.5; extra == "plots"\n'
        "Provides-Extra: demo\n"
        "Requires-Dist: scikit-learn>=1.0; extra == 'demo'\n"
        'Requires-Dist: matplotlib>=3.5; extra == "demo"\n'
    )
    if direct_url is not None:
        text = direct_url if isinstance(direct_url, str) else json.dumps(direct_url)
        (info / "direct_url.json").write_text(text)


def _checkout(folder: Path, with_plugin: bool = True) -> Path:
    if with_plugin:
        (folder / "plugins" / "faiss").mkdir(parents=True)
        (folder / "plugins" / "faiss" / "pyproject.toml").write_text("[project]\n")
    return folder


@pytest.mark.parametrize("editable", [True, False])
def test_a_source_checkout_names_its_plugin_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, editable: bool
) -> None:
    checkout = _checkout(tmp_path / "my clone")
    url = checkout.as_uri()
    _installed(tmp_path / "site", {"url": url, "dir_info": {"editable": editable}})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert source_checkout() == checkout
    assert plugin_install_hint("faiss") == f"{PIP} install -e '{checkout}/plugins/faiss'"
    (checkout / "pyproject.toml").write_text("[project]\n")
    assert extra_install_hint("plots") == f"{PIP} install -e '{checkout}[plots]'"
    (checkout / "constraints.txt").write_text("torch==2.13.0\n")
    pinned = f"-c '{checkout}/constraints.txt'"
    assert extra_install_hint("lightning") == f"{PIP} install {pinned} -e '{checkout}[lightning]'"


@pytest.mark.parametrize(
    "direct_url",
    [
        None,  # installed from an index: pip writes no direct_url.json
        {"url": "https://example.org/pml-3.0.tar.gz", "archive_info": {}},
        {"url": "https://github.com/x/y", "vcs_info": {"vcs": "git", "commit_id": "0"}},
        "{not json",
        "[]",
    ],
)
def test_other_installations_name_the_requirements_not_the_index_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_url: object
) -> None:
    _installed(tmp_path / "site", direct_url)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert plugin_install_hint("faiss").startswith(UNPUBLISHED)
    assert "not on the package index" in plugin_install_hint("faiss")
    assert extra_install_hint("plots") == f"{PIP} install 'matplotlib>=3.5'"
    assert extra_install_hint("demo") == f"{PIP} install 'scikit-learn>=1.0' 'matplotlib>=3.5'"
    assert extra_requirements("umap") == []


def test_a_checkout_without_the_plugin_folder_says_the_plugin_is_unpublished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = _checkout(tmp_path / "clone", with_plugin=False)
    _installed(tmp_path / "site", {"url": checkout.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert source_checkout() == checkout
    assert plugin_install_hint("faiss").startswith(UNPUBLISHED)


def expected_hint() -> str:
    """What this test run's core should advise: read its ``direct_url.json`` plainly."""
    from importlib.metadata import distribution

    text = distribution("pytorch-metric-learning").read_text("direct_url.json")
    record = json.loads(text or "{}")
    if record.get("dir_info") and record.get("url") == ROOT.as_uri():
        return f"{PIP} install -e {shlex.quote(str(ROOT / 'plugins' / 'faiss'))}"
    return UNPUBLISHED


def test_this_installation() -> None:
    assert plugin_install_hint("faiss") == expected_hint()
