"""2.x's ``datasets`` is not in this library: importing it raises an error that says so.

See :mod:`pytorch_metric_learning._missing_2x` and docs/migrating.md.
"""

from __future__ import annotations

from ._missing_2x import raise_missing

raise_missing(__name__)
