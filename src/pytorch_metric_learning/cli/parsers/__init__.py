"""The grammar of ``pml-eval``'s subcommands, kept apart from the work they do.

Each module here defines one subcommand's options, checks what can be checked from the
command line alone, and names the module that does the work
(:mod:`pytorch_metric_learning.cli.evaluate`, ...). Nothing here imports torch or numpy, so
``pml-eval evaluate --help`` and every argument error answer at once; the work module, and
torch with it, is imported only when the command runs.
"""

from __future__ import annotations

__all__: list[str] = []
