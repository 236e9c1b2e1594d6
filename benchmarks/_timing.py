"""The one timing rule of the benchmark scripts: the best of a few repeats."""

from __future__ import annotations

import time
from typing import Any, Callable


def best_of(repeats: int, function: Callable[[], Any]) -> float:
    """The shortest wall time, in seconds, of ``repeats`` calls of ``function``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)
