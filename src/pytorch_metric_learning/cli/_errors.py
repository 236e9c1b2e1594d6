"""The command line's own error: a malformed command line."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """The command line itself is wrong (options missing or contradicting each other)."""
