"""Glue between this library and training frameworks, each behind its own optional extra.

Each module here imports its framework (``lightning``: the ``lightning`` extra); nothing
else in the library imports them, and importing this package imports none of them.
"""

from __future__ import annotations

__all__: list[str] = []
