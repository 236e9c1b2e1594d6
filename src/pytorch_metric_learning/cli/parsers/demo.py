"""The options of ``pml-eval demo`` (the work: :mod:`pytorch_metric_learning.cli.demo`).

The output folder is checked here, before torch is imported and before training starts:
a folder the demo may not write into is refused at once, not after the training.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ...errors import InvalidArgumentError
from ._common import Deferred, add_command, positive_int

if TYPE_CHECKING:  # pathlib is imported when the check runs, not on every --help
    from pathlib import Path

__all__ = ["MARKER", "OUTPUT_NAMES", "check_output_folder", "add_parser"]

MARKER = ".pml-eval-demo"
OUTPUT_NAMES = (
    "models",
    "logs",
    "plots",
    "results.json",
    "val_embeddings.npz",
    "test_embeddings.npz",
    "val_pairs.npz",
    "test_pairs.npz",
)


def check_output_folder(folder: Path | str, overwrite: bool = False) -> list[Path]:
    """The demo's files already in ``folder``, after checking that the demo may replace them.

    Raises:
        InvalidArgumentError: ``folder`` is a file, cannot be created or written, or holds
            files with the demo's names but is not a demo folder and ``overwrite`` is false.

    Example:
        >>> check_output_folder("no-such-folder-here")
        []
    """
    from pathlib import Path

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InvalidArgumentError(
            f"The demo writes into a folder, but --output '{folder}' is a file. "
            "Choose another --output."
        )
    existing = [folder / name for name in OUTPUT_NAMES if (folder / name).exists()]
    if existing and not (overwrite or (folder / MARKER).is_file()):
        raise InvalidArgumentError(
            f"'{folder}' already holds '{existing[0].name}', which the demo did not write. "
            "Choose another --output, or pass --overwrite to replace the demo's files there."
        )
    _check_writable(folder)
    return existing


def _check_writable(folder: Path) -> None:
    """The folder, or the nearest folder above it that exists, accepts new files."""
    nearest = folder.absolute()
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise InvalidArgumentError(
            f"--output '{folder}' cannot be created: '{nearest}' is a file. "
            "Choose another --output."
        )
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"--output '{folder}' cannot be written: no permission to write in '{nearest}'. "
            "Choose another --output."
        )
    _try_a_folder_in(nearest, folder)


def _try_a_folder_in(nearest: Path, folder: Path) -> None:
    """Create and remove an empty folder in ``nearest``: permissions alone do not tell
    (root may write anywhere but not into /proc; a read-only file system)."""
    probe = nearest / f".pml-eval-demo-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:  # a folder could be made there (not ours: left alone)
        return
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise InvalidArgumentError(
            f"--output '{folder}' cannot be created: making a folder in '{nearest}' failed "
            f"({reason}). Choose another --output."
        ) from None
    probe.rmdir()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand to ``pml-eval``'s subparsers."""
    parser = add_command(
        subparsers,
        "demo",
        "Run the library's main job end to end on the UCI handwritten digits "
        "(bundled with scikit-learn; no network): train a small embedding network with "
        "validation after each epoch, keep the best model, score the test split, choose a "
        "verification threshold, and write checkpoints, records and plots.",
    )
    parser.add_argument(
        "--output", default="pml-demo", metavar="DIR", help="folder to write to (default: pml-demo)"
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--epochs", type=positive_int, default=None, help="training epochs (default: 20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    length.add_argument(
        "--quick", action="store_true", help="two epochs (a smoke test; not with --epochs)"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files with the demo's names in DIR even if DIR is not a demo folder",
    )
    parser.set_defaults(run=Deferred("demo", (_output_folder,)))


def _output_folder(args: argparse.Namespace) -> None:
    check_output_folder(args.output, args.overwrite)
