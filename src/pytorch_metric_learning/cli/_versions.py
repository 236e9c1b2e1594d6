"""Versions of distributions, recorded next to results for reproducibility."""

from __future__ import annotations

import platform
import sys

if sys.version_info >= (3, 10):
    from importlib.metadata import PackageNotFoundError, version
else:  # pragma: no cover
    from importlib_metadata import PackageNotFoundError, version

__all__ = ["distribution_version", "environment_versions"]


def distribution_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``""`` when it is not installed.

    Example:
        >>> distribution_version("no-such-distribution-here")
        ''
    """
    try:
        return version(name)
    except (PackageNotFoundError, ValueError):
        return ""


def environment_versions() -> dict[str, str]:
    """Python, torch, numpy and this library's versions."""
    return {
        "python": platform.python_version(),
        "pytorch-metric-learning": distribution_version("pytorch-metric-learning"),
        "torch": distribution_version("torch"),
        "numpy": distribution_version("numpy"),
    }
