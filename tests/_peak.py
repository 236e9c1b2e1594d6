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

needs_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)"
)
