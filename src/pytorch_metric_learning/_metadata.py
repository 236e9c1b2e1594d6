"""``importlib.metadata``, or its backport on Python 3.9: the version switch in one place."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 10):
    from importlib.metadata import (
        EntryPoint,
        PackageNotFoundError,
        distribution,
        entry_points,
        version,
    )
else:  # pragma: no cover
    from importlib_metadata import (
        EntryPoint,
        PackageNotFoundError,
        distribution,
        entry_points,
        version,
    )

__all__ = ["EntryPoint", "PackageNotFoundError", "distribution", "entry_points", "version"]
