"""Exit codes, one-line errors and the two ways to start the command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning import __version__
from pytorch_metric_learning.cli._commands import COMMANDS
from pytorch_metric_learning.cli.app import EXIT_INTERNAL, EXIT_USAGE, build_parser, main

from .conftest import error_line, run_subprocess


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
    def explode(*args: object) -> list[object]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("pytorch_metric_learning.cli.backends.backend_statuses", explode)
    result = cli("backends")
    assert result.code == EXIT_INTERNAL
    assert result.err.count("\n") == 1
    assert "internal error: ZeroDivisionError: boom" in result.err
    assert "--traceback" in result.err


def test_traceback_flag_reraises(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object) -> list[object]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("pytorch_metric_learning.cli.backends.backend_statuses", explode)
    with pytest.raises(ZeroDivisionError):
        cli("--traceback", "backends")


def test_unwritable_output_is_an_input_error(cli, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("backends", "--output", blocker / "inside.json")
    assert result.code == 1
    assert f"'{blocker}' is a file, not a folder" in error_line(result.err)


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
    completed = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0
    assert completed.stdout.strip() == f"pml-eval {__version__}"


def _imports_after(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after ``main(argv)``."""
    code = (
        "import sys\nfrom pytorch_metric_learning.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print()\nprint(' '.join(sorted(sys.modules)))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return set(completed.stdout.splitlines()[-1].split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["-h"]])
def test_help_and_version_import_neither_torch_nor_a_subcommand(argv: list[str]) -> None:
    modules = _imports_after(argv)
    assert "pytorch_metric_learning.cli.app" in modules  # the command really ran
    assert "torch" not in modules and "numpy" not in modules
    assert not {f"pytorch_metric_learning.cli.{name}" for name in COMMANDS} & modules


def test_a_subcommand_imports_only_its_own_parser() -> None:
    modules = _imports_after(["threshold", "--help"])
    assert "pytorch_metric_learning.cli.parsers.threshold" in modules
    assert "pytorch_metric_learning.cli.parsers.demo" not in modules
    assert "pytorch_metric_learning.cli.threshold" not in modules  # the work, not needed


# Every subcommand's help, and argument errors of each kind: argparse's own (a missing
# or unknown option, a malformed value), an unknown name, contradictory options.
NO_TORCH_ARGV = [
    *([name, "--help"] for name in COMMANDS),
    ["evaluate"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--no-such-option"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--metrics", "precision_at_0"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--k", "0"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--device", "not a device"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--device", "bogus"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--device", "cuda:01"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--device", "CPU"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--device", "meta"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--ci-by-class"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--knn", "{broken json"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--ci", "0.95"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--ci", "95", "--per-class"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--reference", "r.npy"],
    ["evaluate", "q.npy", "--labels", "l.npy", "--output", "q.npy"],
    ["compare", "a.npy", "b.npy", "--labels", "l.npy", "--reference", "1", "2", "3"],
    ["compare", "a.npy", "b.npy", "--labels", "l.npy", "--metrics", "NMI"],
    ["compare", "a.npy", "b.npy", "--labels", "l.npy", "--device", "bogus"],
    ["compare", "a.npy", "b.npy", "--labels", "l.npy", "--device", "cuda:x"],
    ["threshold", "s.npy"],
    ["threshold", "s.npy", "--labels", "l.npy", "--metric", "tar@far=2"],
    ["threshold", "s.npy", "--labels", "l.npy", "--plot", "s.npy"],
    ["backends", "--output", "."],
    ["demo", "--epochs", "0"],
    ["demo", "--quick", "--epochs", "3"],
    ["no-such-command"],
]


@pytest.mark.parametrize("argv", NO_TORCH_ARGV, ids=" ".join)
def test_help_and_argument_errors_answer_without_torch(argv: list[str]) -> None:
    """Not a timing test: what is imported decides the time, so that is what is checked."""
    modules = _imports_after(argv)
    assert "pytorch_metric_learning.cli.app" in modules
    assert "torch" not in modules and "numpy" not in modules
    assert not {f"pytorch_metric_learning.cli.{name}" for name in COMMANDS} & modules


# Modules that cost milliseconds each and that no --help or argument error needs: importlib
# .metadata (about 86 ms: it was imported with the backend specs), dataclasses with inspect,
# ast and dis, pathlib with urllib, json.
HEAVY_MODULES = {"importlib.metadata", "dataclasses", "inspect", "ast", "pathlib", "json"}


@pytest.mark.parametrize(
    "argv",
    [
        *([name, "--help"] for name in COMMANDS),
        ["evaluate", "q.npy", "--labels", "l.npy", "--device", "bogus"],
        ["compare", "a.npy", "b.npy", "--labels", "l.npy", "--metrics", "NMI"],
        ["demo", "--quick", "--epochs", "3"],
        ["threshold", "s.npy"],
    ],
    ids=" ".join,
)
def test_a_subcommand_help_imports_no_more_than_the_top_help(argv: list[str]) -> None:
    """``pml-eval CMD --help`` imports none of the heavy modules ``pml-eval --help`` skips."""
    top = _imports_after(["--help"])
    modules = _imports_after(argv)
    assert f"pytorch_metric_learning.cli.parsers.{argv[0]}" in modules  # its parser ran
    assert (HEAVY_MODULES & modules) <= top, HEAVY_MODULES & modules - top


@pytest.mark.parametrize("argv", NO_TORCH_ARGV[len(COMMANDS) :], ids=" ".join)
def test_argument_errors_exit_2_with_one_line(argv: list[str], capsys) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("pml-eval: error: ") and "\n" not in err, err


def test_a_demo_folder_that_cannot_be_made_is_refused_before_torch(tmp_path: Path) -> None:
    """Permissions alone pass /proc for root; making a folder there fails: refused at once."""
    for folder in ("/proc/no-such-folder", "/proc/no-such-folder/deeper", "/dev/null/inside"):
        modules = _imports_after(["demo", "--output", folder])
        assert "pytorch_metric_learning.cli.parsers.demo" in modules
        assert "torch" not in modules and "numpy" not in modules
        result = run_subprocess("demo", "--output", folder)
        assert result.code == 1
        assert result.out == ""  # no "Training ..." announced
        # "cannot be created" (root), or "cannot be written" (no permission for others)
        assert f"--output '{folder}' cannot be " in error_line(result.err)


def test_the_demo_folder_check_leaves_nothing_behind(tmp_path: Path) -> None:
    from pytorch_metric_learning.cli.parsers.demo import check_output_folder

    (tmp_path / "keep.txt").write_text("mine")
    assert check_output_folder(tmp_path / "new" / "deeper") == []
    assert check_output_folder(tmp_path) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("position", ["before", "after"])
def test_verbose_before_or_after_the_subcommand_adds_progress(
    cli, tmp_path: Path, position: str
) -> None:
    from .test_loaders import write

    query = write(tmp_path / "q.npy", np.arange(24, dtype=np.float32).reshape(12, 2))
    labels = write(tmp_path / "l.npy", np.arange(12) % 3)
    argv = ["evaluate", query, "--labels", labels, "--metrics", "precision_at_1"]
    quiet = cli(*argv)
    verbose = cli("-v", *argv) if position == "before" else cli(*argv, "--verbose")
    assert quiet.code == verbose.code == 0
    assert "Read 12 queries and 12 references of 2 dims" in verbose.err
    assert "k-NN backend: CustomKNN(" in verbose.err
    assert "Read 12 queries" not in quiet.err
    assert quiet.out == verbose.out


def test_double_verbose_adds_debug_messages(tmp_path: Path) -> None:
    from .test_loaders import write

    query = write(tmp_path / "q.npy", np.arange(24, dtype=np.float32).reshape(12, 2))
    labels = write(tmp_path / "l.npy", np.arange(12) % 3)
    # A fresh interpreter: the registry logs a backend's loading only once per process.
    result = run_subprocess(
        "-vv",
        "evaluate",
        query,
        "--labels",
        labels,
        "--metrics",
        "precision_at_1",
        "--knn",
        "custom",
    )
    assert result.code == 0
    assert "Loaded knn backend 'custom'" in result.err


def test_demo_advice_names_the_command_as_it_was_started() -> None:
    from pytorch_metric_learning.cli.demo import command_name

    assert command_name(".venv/bin/pml-eval") == ".venv/bin/pml-eval"
    assert command_name("/opt/my env/bin/pml-eval") == "'/opt/my env/bin/pml-eval'"
    module_run = command_name("/src/pytorch_metric_learning/__main__.py")
    assert module_run.endswith(" -m pytorch_metric_learning")
    assert Path(module_run.split(" -m ")[0].strip("'")) == Path(sys.executable)
