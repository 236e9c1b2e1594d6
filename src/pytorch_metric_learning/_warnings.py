"""Warnings attributed to the caller's line, outside this package."""

from __future__ import annotations

import inspect
import os
import warnings

__all__ = ["warn_external"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_external(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn with ``stacklevel`` pointing at the first frame outside this package."""
    frame = inspect.currentframe()
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    del frame
    warnings.warn(message, category, stacklevel=level)
