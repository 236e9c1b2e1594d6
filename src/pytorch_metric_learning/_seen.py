"""Remember, across runs, which notices this environment has already shown.

A notice about the installed packages (a plugin claiming a core backend name) says the
same thing on every run until the environment changes, so it is shown once per key (the
key names the packages involved and their versions) and remembered in a small JSON file
in the user's cache folder. The file is replaced atomically; when it cannot be read or
written the notice is simply shown again, never an error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "first_time"]

logger = logging.getLogger(__name__)

_FILE = "seen_notices.json"
_MAX_KEYS = 200  # the oldest are forgotten first


def cache_dir() -> Path:
    """``$PML_CACHE_DIR``, else the platform's user cache folder + ``pytorch_metric_learning``."""
    override = os.environ.get("PML_CACHE_DIR")
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytorch_metric_learning"


def first_time(key: str) -> bool:
    """True unless ``key`` was recorded before; records it (best effort)."""
    path = cache_dir() / _FILE
    seen = _read(path)
    if key in seen:
        return False
    _write(path, [*seen, key][-_MAX_KEYS:])
    return True


def _read(path: Path) -> list[str]:
    try:
        keys = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [key for key in keys if isinstance(key, str)] if isinstance(keys, list) else []


def _write(path: Path, keys: list[str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{_FILE}.", suffix=".tmp", dir=path.parent)
        try:
            try:
                os.write(handle, json.dumps(keys).encode("utf-8"))
            finally:
                os.close(handle)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    except OSError as error:
        logger.debug("Could not remember a shown notice in %s: %s", path, error)
