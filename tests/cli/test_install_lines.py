"""Every documented install line works as written, from a clone, in a fresh venv.

The repository's tracked files are copied to a temporary folder (a clone, as a reader has
one), and every ``python3 -m venv`` / ``.venv/bin/pip install`` step of the pages below is
run there by a shell, exactly as the page spells it, into one fresh ``.venv`` (the steps
add to each other as a reader's would). torch comes from local disk through
``constraints.txt``. Lines naming the published package (``"pytorch-metric-learning[...]"``)
are on the pages only to say that the package index holds 2.x; none may be an install step.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INLINE = re.compile(r"`([^`]+)`")
# page -> the section whose commands are install lines (None: the whole page)
PAGES: dict[str, str | None] = {
    "docs/getting-started.md": "Install",
    "README.md": "Set-up commands",
    "docs/faiss.md": "Installing",
    "plugins/faiss/README.md": "Install",
    "docs/migrating.md": None,
}


def section(path: Path, title: str | None) -> str:
    """The text of the ``## title`` section of a markdown page (all of it for ``None``)."""
    text = path.read_text(encoding="utf-8")
    if title is None:
        return text
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
    return [p for p in parts if p.startswith("python3 -m venv") or p.startswith(".venv/bin/pip ")]


def documented_steps(root: Path) -> list[str]:
    """Every install step of the pages, in page order."""
    return [
        step
        for page, title in PAGES.items()
        for command in commands(section(root / page, title))
        for step in install_steps(command)
    ]


def run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_pages_document_the_expected_install_lines() -> None:
    """Fast: what the slow test runs is really there, and every step pins torch."""
    steps = documented_steps(ROOT)
    pip_steps = [step for step in steps if step.startswith(".venv/bin/pip ")]
    assert sum("plugins/faiss" in step for step in steps) >= 4, steps
    assert any(step.startswith("python3 -m venv") for step in steps), steps
    for step in pip_steps:
        assert "-c constraints.txt" in step, step
        assert "pytorch-metric-learning[" not in step, step
    readme = commands(section(ROOT / "README.md", "Set-up commands"))
    assert len(readme) == 2, readme  # the main job, and the whole test suite
    assert any(c.endswith("pml-eval demo") for c in readme), readme
    assert any("nox -s tests tests_faiss" in c for c in readme), readme
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "pytorch-metric-learning-faiss" not in pyproject  # no extra that cannot resolve


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy")
    folder = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


@pytest.mark.timeout(30 * 60)  # several installs of up to 900 s each (run())
def test_documented_install_lines_work_as_written(clone: Path) -> None:
    steps = list(dict.fromkeys(documented_steps(clone)))  # a repeated line runs once
    first_plugin_step = next(i for i, s in enumerate(steps) if "plugins/faiss" in s)
    for index, step in enumerate(steps):
        if index == first_plugin_step:
            _check_hint_before_the_plugin(clone)
        done = run(step, clone)
        assert done.returncode == 0, (step, done.stderr[-3000:])
    _check_faiss_works(clone)
    _check_torch_is_the_pinned_build(clone)


def _check_hint_before_the_plugin(clone: Path) -> None:
    """Without the plugin, the error names this venv's interpreter and this clone's plugin
    folder, and that command, run as printed from another folder, installs it."""
    code = "from pytorch_metric_learning.evaluation import FaissKNN; FaissKNN()"
    done = run(f".venv/bin/python -c {shlex.quote(code)}", clone)
    assert "BackendNotInstalledError" in done.stderr, done.stderr[-2000:]
    python = clone / ".venv" / "bin" / "python"
    hint = (
        f"{shlex.quote(str(python))} -m pip install -e "
        f"{shlex.quote(str(clone / 'plugins' / 'faiss'))}"
    )
    assert hint in done.stderr, done.stderr[-2000:]
    installed = run(hint, clone.parent)
    assert installed.returncode == 0, installed.stderr[-3000:]


def _check_faiss_works(clone: Path) -> None:
    listing = run(".venv/bin/pml-eval backends --output -", clone)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    for kind in ("knn", "kmeans"):
        statuses = {row["name"]: row["status"] for row in rows[kind]}
        assert statuses.get("faiss") == "ok", rows


def _check_torch_is_the_pinned_build(clone: Path) -> None:
    """No step pulled another torch (a CUDA build brings gigabytes of nvidia wheels)."""
    pinned = (clone / "constraints.txt").read_text(encoding="utf-8")
    version = re.search(r"^torch==(\S+)", pinned, re.MULTILINE)
    assert version is not None
    done = run(".venv/bin/python -m pip list --format json", clone)
    installed = {row["name"].lower(): row["version"] for row in json.loads(done.stdout)}
    assert installed["torch"].split("+")[0] == version.group(1)
    assert not [name for name in installed if name.startswith("nvidia-")], installed
