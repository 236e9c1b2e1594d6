"""Running a Python snippet in a fresh interpreter, for the tests that need one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_python(
    code: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -c code *args`` with this interpreter: its output captured as text, a
    non-zero exit raised as :class:`subprocess.CalledProcessError`."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
