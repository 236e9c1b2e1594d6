"""Exit codes, one-line errors and the two ways to start the command."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytorch_metric_learning import __version__
from pytorch_metric_learning.cli.app import EXIT_INTERNAL, EXIT_USAGE, build_parser

from .conftest import run_subprocess


def test_version(cli) -> None:
    result = cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"pml-eval {__version__}"


def test_help_lists_the_commands(cli) -> None:
    result = cli("--help")
    assert result.code == 0
    assert "backends" in result.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "the following arguments are required: COMMAND (see 'pml-eval --help')"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("backends", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line(cli, argv: tuple[str, ...], message: str) -> None:
    result = cli(*argv)
    assert result.code == EXIT_USAGE
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert result.err.startswith("pml-eval: error: ")
    assert message in result.err


def test_unexpected_errors_are_one_line(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(kind: str) -> list[object]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("pytorch_metric_learning.cli.backends.backend_statuses", explode)
    result = cli("backends")
    assert result.code == EXIT_INTERNAL
    assert result.err.count("\n") == 1
    assert "internal error: ZeroDivisionError: boom" in result.err
    assert "--traceback" in result.err


def test_traceback_flag_reraises(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(kind: str) -> list[object]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("pytorch_metric_learning.cli.backends.backend_statuses", explode)
    with pytest.raises(ZeroDivisionError):
        cli("--traceback", "backends")


def test_unwritable_output_is_an_input_error(cli, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("backends", "--output", blocker / "inside.json")
    assert result.code == 1
    assert result.err.startswith("pml-eval: error: ")
    assert result.err.count("\n") == 1


def test_parser_subcommands() -> None:
    assert build_parser().parse_args(["backends"]).command == "backends"


def test_module_entry_point() -> None:
    result = run_subprocess("--version")
    assert result.code == 0
    assert result.out.strip() == f"pml-eval {__version__}"


def test_console_script_is_installed() -> None:
    script = shutil.which("pml-eval", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the console script is not installed next to this interpreter")
    import subprocess

    completed = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0
    assert completed.stdout.strip() == f"pml-eval {__version__}"
