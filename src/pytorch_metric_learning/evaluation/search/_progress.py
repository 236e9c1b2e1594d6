"""A progress bar for long k-NN searches: on a terminal only, after a few seconds.

A search of a million-row gallery runs for minutes with nothing to show; a tqdm bar, counted
in query-reference pairs, tells how far it is. It appears only when standard error is a
terminal (never in logs, pipes or notebooks' captured output), only once a search has run
for ``DELAY_SECONDS`` (short searches never draw one), and never when the environment
variable ``PML_DISABLE_PROGRESS`` is set to anything but ``""`` or ``"0"``. The bar is
removed when the search ends.
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType

from tqdm import tqdm

__all__ = ["DELAY_SECONDS", "DISABLE_ENV", "SearchProgress", "progress_enabled"]

DISABLE_ENV = "PML_DISABLE_PROGRESS"
# Seconds a search runs before its bar appears.
DELAY_SECONDS = 3.0


def progress_enabled() -> bool:
    """Whether a long search draws a bar: standard error is a terminal and the user did
    not set ``PML_DISABLE_PROGRESS``.

    Example:
        >>> import os
        >>> os.environ["PML_DISABLE_PROGRESS"] = "1"
        >>> progress_enabled()
        False
        >>> del os.environ["PML_DISABLE_PROGRESS"]
    """
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return False
    stream = sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


class SearchProgress:
    """Pairs searched so far, as a tqdm bar on standard error (see the module's notes).

    ``update`` may be called from several threads at once (the compiled search's).

    Args:
        total: Query-reference pairs the search will score.
        description: The bar's label.
    """

    def __init__(self, total: int, description: str = "k-NN search") -> None:
        self._lock = threading.Lock()
        self._bar = tqdm(
            total=total,
            desc=description,
            unit="pair",
            unit_scale=True,
            delay=DELAY_SECONDS,
            leave=False,
            file=sys.stderr,
            disable=not progress_enabled(),
        )

    def update(self, pairs: int) -> None:
        """Count ``pairs`` more scored pairs."""
        if self._bar.disable:
            return
        with self._lock:
            self._bar.update(pairs)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> SearchProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
