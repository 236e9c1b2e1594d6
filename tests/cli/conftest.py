"""Fixtures for the command-line tests: run ``pml-eval`` in-process or as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytorch_metric_learning.cli import main
from pytorch_metric_learning.evaluation.search import registry


@dataclass
class Result:
    code: int
    out: str
    err: str


def error_line(err: str) -> str:
    """The single ``pml-eval: error:`` line (warnings, e.g. from installed test plugins, aside)."""
    lines = [line for line in err.splitlines() if not line.startswith("pml-eval: warning:")]
    assert len(lines) == 1 and lines[0].startswith("pml-eval: error: "), err
    return lines[0]


def assert_one_error(result: Result, code: int, message: str) -> None:
    """``result`` is exit ``code`` with nothing on stdout and one error line containing
    ``message`` on stderr (no traceback)."""
    assert result.code == code
    assert result.out == ""
    assert result.err.startswith("pml-eval: error: ")
    assert result.err.count("\n") == 1
    assert message in result.err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Call ``main(argv)`` and return its exit code with what it printed."""

    def run(*argv: object) -> Result:
        capsys.readouterr()
        code = main([str(arg) for arg in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def run_subprocess(*argv: object, env: dict[str, str] | None = None) -> Result:
    """Run ``python -m pytorch_metric_learning ARGV`` in a fresh interpreter."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytorch_metric_learning", *map(str, argv)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` holding fake installed distributions (``.dist-info``).

    Call ``add_distribution`` to create one; the registry forgets its caches around the test.
    """
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    registry._reset_for_tests()
    yield folder
    registry._reset_for_tests()
    for name in [name for name in sys.modules if name.startswith("fake_pml_")]:
        del sys.modules[name]


def add_distribution(
    folder: Path, name: str, version: str, entry_points: str, modules: dict[str, str]
) -> None:
    """Write an installed-looking distribution with its entry points and modules."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    for module, source in modules.items():
        (folder / f"{module}.py").write_text(source, encoding="utf-8")
