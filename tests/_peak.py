"""A child process's own peak resident set, for the tests that measure memory.

Source text for the scripts those tests run in fresh processes. ``ru_maxrss`` would not
do: Linux carries the parent's peak into a child across ``fork`` and ``exec``, so a child
of a large pytest worker reports the worker's peak (``benchmarks/_memory.py`` says more).
"""

from __future__ import annotations

import sys

import pytest

PEAK_SOURCE = '''
def peak_bytes():
    """This process's peak resident set (VmHWM: since its exec), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
'''

# The environment of every child whose peak a test measures: a fixed thread count. Without
# one, searches on a loaded machine add a thread (and its tile buffer, 16 MiB) per busy
# core, so a peak would follow the machine's load, not the input (a CI run under load once
# measured 33 MiB of growth against 8 on a quiet machine).
STEADY_THREADS = {"PML_NUM_THREADS": "2"}

needs_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)"
)
