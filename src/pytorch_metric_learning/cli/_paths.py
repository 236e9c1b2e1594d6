"""Refuse a command whose output file would replace one of its own inputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._errors import UsageError

if TYPE_CHECKING:  # pathlib is imported when a check runs, not on every --help
    from pathlib import Path

__all__ = ["check_outputs"]


def check_outputs(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None]) -> None:
    """Raise :class:`UsageError` if an output path names an input, another output or a folder.

    Keys are the option names (``--output``, ``QUERY``); ``None`` and ``-`` (stdout) are
    skipped, an empty output path is refused, and an input's ``:KEY`` suffix is ignored. Paths are compared as files
    (``os.path.samefile``: links and relative spellings of one file are one file), or as
    resolved paths when the output does not exist yet.

    Example:
        >>> check_outputs({"--output": "a.json"}, {"QUERY": "a.json"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pytorch_metric_learning.cli._errors.UsageError: --output 'a.json' is the QUERY file ...
    """
    from pathlib import Path

    files = {option: _file_of(text) for option, text in inputs.items() if text}
    for option, text in outputs.items():
        if text is None or text == "-":
            continue
        if not text:
            raise UsageError(f"{option} is an empty path; give the path of a file (or '-').")
        if os.path.isdir(text):
            raise UsageError(f"{option} '{text}' is a folder; give the path of a file in it.")
        for other, path in files.items():
            if _same_file(Path(text), path):
                role = "an output of this command too" if other in outputs else "an input"
                raise UsageError(
                    f"{option} '{text}' is the {other} file ('{path}'), {role}; writing there "
                    f"would replace it. Choose another {option} path."
                )
        files[option] = Path(text)


def _file_of(text: str) -> Path:
    """``data.npz:query`` -> ``data.npz`` (only when the plain name does not exist)."""
    from pathlib import Path

    head, sep, tail = text.rpartition(":")
    if sep and tail and not os.path.exists(text) and os.path.exists(head):
        return Path(head)
    return Path(text)


def _same_file(first: Path, second: Path) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return first.resolve() == second.resolve()
