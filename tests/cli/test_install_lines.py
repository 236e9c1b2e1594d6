"""The install lines of README.md and docs/getting-started.md work as written, in a fresh venv.

The repository's tracked files are copied to a temporary folder (a clone, as a reader has
one), and every documented ``python3 -m venv`` / ``.venv/bin/pip install`` command is run
there by a shell, exactly as the page spells it. Lines for the published package
(``pip install "pytorch-metric-learning[faiss]"``) address the package index, not a
clone, and are not run. torch comes from local disk through ``constraints.txt``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INLINE = re.compile(r"`([^`]+)`")


def section(path: Path, title: str) -> str:
    """The text of the ``## title`` section of a markdown page."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def commands(text: str) -> list[str]:
    """Shell commands shown as indented blocks, ``$ `` console lines or inline code."""
    found = []
    for line in text.splitlines():
        if line.startswith("    ") and not line.strip().startswith("$"):
            found.append(line.strip())
        elif line.startswith("$ "):
            found.append(line[2:].strip())
        else:
            found += INLINE.findall(line)
    return [command for command in found if "venv" in command or "pip install" in command]


def install_steps(command: str) -> list[str]:
    """The venv and pip parts of a chained command (running the demo or nox is not install)."""
    parts = [part.strip() for part in command.split("&&")]
    return [p for p in parts if p.startswith("python3 -m venv") or ".venv/bin/pip install" in p]


def run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy")
    folder = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


def test_documented_install_lines_work_as_written(clone: Path) -> None:
    readme = [c for c in commands(section(clone / "README.md", "Set-up commands"))]
    started = commands(section(clone / "docs" / "getting-started.md", "Install"))
    published = [c for c in readme + started if "pytorch-metric-learning[" in c]
    steps = [s for c in readme + started if c not in published for s in install_steps(c)]
    # README: the venv + core chain, the faiss plugin step, the test suite's pip install nox;
    # getting-started: venv, core, plugin, core with plots and the plugin.
    assert len([s for s in steps if "plugins/faiss" in s]) >= 3, steps
    assert sum("python3 -m venv" in s for s in steps) >= 3, steps

    first_plugin_step = next(i for i, s in enumerate(steps) if "plugins/faiss" in s)
    for index, step in enumerate(steps):
        if index == first_plugin_step:
            _check_hint_before_the_plugin(clone)
        done = run(step, clone)
        assert done.returncode == 0, (step, done.stderr[-3000:])
    _check_faiss_works(clone)


def _check_hint_before_the_plugin(clone: Path) -> None:
    """Without the plugin, the error gives this clone's command, and that command works."""
    code = "from pytorch_metric_learning.evaluation import FaissKNN; FaissKNN()"
    done = run(f".venv/bin/python -c {shlex.quote(code)}", clone)
    assert "BackendNotInstalledError" in done.stderr, done.stderr[-2000:]
    hint = f"pip install -e {clone / 'plugins' / 'faiss'}"
    assert hint in done.stderr, done.stderr[-2000:]
    installed = run(f".venv/bin/{hint}", clone)
    assert installed.returncode == 0, installed.stderr[-3000:]


def _check_faiss_works(clone: Path) -> None:
    listing = run(".venv/bin/pml-eval backends --output -", clone)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    for kind in ("knn", "kmeans"):
        statuses = {row["name"]: row["status"] for row in rows[kind]}
        assert statuses.get("faiss") == "ok", rows
    assert Path(clone / ".venv" / "bin" / "pml-eval").is_file()
    assert sys.executable  # the test's own interpreter is untouched by the clone's venv
