"""The subcommands of ``pml-eval``: name, one-line help, and the module that runs it.

This table is all that ``pml-eval --help`` needs, so the top-level help and ``--version``
import neither torch nor any subcommand.
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

# name -> (module under pytorch_metric_learning.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": ("evaluate", "retrieval and clustering metrics of embedding files"),
    "compare": (
        "compare",
        "compare two models' embeddings of the same queries, with a paired bootstrap",
    ),
    "threshold": ("threshold", "choose a verification threshold from scored pairs"),
    "backends": ("backends", "list the installed k-NN and k-means backends and check each one"),
    "demo": ("demo", "train, validate, test and choose a threshold on the UCI digits"),
}
