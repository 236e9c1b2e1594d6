"""The one memory rule of the benchmark scripts: a process's own peak resident set.

``getrusage(RUSAGE_SELF).ru_maxrss`` is not that in a child process: Linux carries the
parent's peak across ``fork``/``vfork`` and ``exec`` into it, so a child started by a
parent that once held 500 MB reports at least 500 MB whatever it does. ``VmHWM`` in
``/proc/self/status`` belongs to the memory map that ``exec`` created and starts from
zero there. Where ``/proc`` is missing (macOS), ``ru_maxrss`` is the only measure left.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

STATUS = Path("/proc/self/status")


def peak_rss_bytes() -> int:
    """This process's peak resident set since it started (or exec'd), in bytes."""
    found = _status_kib("VmHWM")
    if found is not None:
        return found * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, others KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def rss_bytes() -> int:
    """This process's resident set now, in bytes (its peak where ``/proc`` is missing)."""
    found = _status_kib("VmRSS")
    return found * 1024 if found is not None else peak_rss_bytes()


def _status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status``, or None without ``/proc``."""
    try:
        lines = STATUS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None
