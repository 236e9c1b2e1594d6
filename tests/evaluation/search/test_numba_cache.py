"""numba's cache of the compiled top-k loops in a non-editable install into a read-only
site-packages: the first process compiles them, the next ones load them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytorch_metric_learning.evaluation.search import _compiled_topk

REPO = Path(__file__).resolve().parents[3]
# Root writes to read-only folders: its children run without the capabilities to do so.
NO_OVERRIDE = "-dac_override,-dac_read_search"
AS_ROOT = os.geteuid() == 0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _compiled_topk.installed(), reason="numba is not installed"),
    pytest.mark.skipif(
        AS_ROOT and shutil.which("setpriv") is None,
        reason="as root, read-only folders need setpriv (util-linux) to be read-only",
    ),
]

# Loads the loops as a search does, then reports numba's cache statistics of each of them.
CHILD = """
import json, numba, pytorch_metric_learning
from pytorch_metric_learning.evaluation.search import _compiled_topk
assert _compiled_topk.available()
from pytorch_metric_learning.evaluation.search import _topk_kernels
loops = [f for f in vars(_topk_kernels).values() if isinstance(f, numba.core.dispatcher.Dispatcher)]
stats = [f.stats for f in loops]
print(json.dumps({
    "package": pytorch_metric_learning.__file__,
    "hits": sum(sum(s.cache_hits.values()) for s in stats),
    "misses": sum(sum(s.cache_misses.values()) for s in stats),
    "paths": sorted({s.cache_path for s in stats if s.cache_hits or s.cache_misses}),
}))
"""


@pytest.fixture(scope="module")
def installed() -> Iterator[dict[str, Path]]:
    """A virtualenv with this project installed from its wheel (its dependencies from the
    test environment) and a read-only site-packages; folders for the caches."""
    root = Path(tempfile.mkdtemp(prefix="pml-readonly-"))
    try:
        venv = root / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
        python = venv / "bin" / "python"
        _pip(["install", "--no-deps", "--no-index", str(_wheel(root))], python)
        site = Path(_run(python, "import sysconfig; print(sysconfig.get_path('purelib'))"))
        (site / "dependencies.pth").write_text("\n".join(_dependency_folders()) + "\n")
        _set_writable(site, False)
        folders = {"python": python, "site": site}
        for name in ("cache", "home", "tmp"):
            folders[name] = root / name
            folders[name].mkdir()
        yield folders
    finally:
        _set_writable(root, True)
        shutil.rmtree(root, ignore_errors=True)


def _wheel(root: Path) -> Path:
    """This project's wheel, built from a copy of the sources (the build writes beside them)."""
    source = root / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    dist = root / "dist"
    _pip(["wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)])
    return next(dist.glob("pytorch_metric_learning-*.whl"))


def _pip(arguments: list[str], python: Path | None = None) -> None:
    target = ["--python", str(python)] if python else []
    subprocess.run(
        [sys.executable, "-m", "pip", *target, "-q", *arguments],
        check=True,
        capture_output=True,
        timeout=300,
    )


def _dependency_folders() -> list[str]:
    """The site-packages folders that hold torch, numpy and numba here."""
    import numba
    import numpy
    import torch

    return sorted(
        {str(Path(module.__file__).resolve().parents[1]) for module in (torch, numpy, numba)}
    )


def _set_writable(folder: Path, writable: bool) -> None:
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~write)


def _run(python: Path, code: str, env: dict[str, str] | None = None) -> str:
    """The last line ``python -c code`` prints; with ``env``, run as a user bound by the
    folders' permissions."""
    command = [str(python), "-c", code]
    if AS_ROOT and env is not None:
        command = ["setpriv", f"--inh-caps={NO_OVERRIDE}", f"--bounding-set={NO_OVERRIDE}"]
        command += ["--", str(python), "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _child_env(folders: dict[str, Path]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("NUMBA_")}
    env.pop("PYTHONPATH", None)
    env.update(
        XDG_CACHE_HOME=str(folders["cache"]), HOME=str(folders["home"]), TMPDIR=str(folders["tmp"])
    )
    return env


def _load_twice(folders: dict[str, Path]) -> tuple[dict, dict]:
    env = _child_env(folders)
    return tuple(json.loads(_run(folders["python"], CHILD, env)) for _ in range(2))


def test_the_second_process_loads_the_loops_from_the_user_cache(installed) -> None:
    before = sorted(installed["site"].rglob("*"))
    first, second = _load_twice(installed)
    assert Path(first["package"]).is_relative_to(installed["site"])  # the wheel, not the tree
    assert first["misses"] > 0  # compiled (nothing cached yet)
    assert second["misses"] == 0 and second["hits"] > 0  # loaded, nothing compiled
    user_cache = installed["cache"] / "numba"
    assert second["paths"] and all(Path(p).is_relative_to(user_cache) for p in second["paths"])
    assert sorted(installed["site"].rglob("*")) == before  # nothing written in site-packages


def test_without_a_writable_user_cache_the_loops_cache_in_the_temporary_folder(
    installed,
) -> None:
    _set_writable(installed["cache"], False)
    try:
        first, second = _load_twice(installed)
    finally:
        _set_writable(installed["cache"], True)
    assert first["misses"] > 0
    assert second["misses"] == 0 and second["hits"] > 0
    fallback = installed["tmp"] / f"pml-numba-{os.getuid()}"
    assert second["paths"] and all(Path(p).is_relative_to(fallback) for p in second["paths"])
