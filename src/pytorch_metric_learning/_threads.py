"""How many CPU threads a large computation of the library uses: the user's count, else as
many as there are free cores.

PyTorch starts one intra-op (OpenMP) thread per core; each parallel operation splits its
work evenly over them and waits for the slowest. When another process keeps a core busy,
the thread that shares it runs at a fraction of the speed, every operation waits for it,
and a search made of thousands of operations took up to 9 times as long as on one thread
(docs/benchmarks.md, "Speed on a busy machine"). So a large search (and ``get_accuracy``)
first measures, over ``WINDOW`` seconds, how busy the cores of this process's affinity are
(``/proc/stat``, less this process's own CPU time) and runs on no more threads than there
are free cores, for that call only; PyTorch's count is restored afterwards.
Work that threads take piece by piece when they are free (the tiles of the k-NN walk),
and so never waits for a slow thread but at its very end, runs on the count from before
plus one thread per busy core: :func:`dynamic_threads`. Measured under load, the walk took
0.55 to 0.7 of its one-thread time on two threads, for the same CPU time, where PyTorch's
parallel operations took eight times the CPU time of one thread. The thread more per busy
core is there because the kernel balances runnable threads across cores, not processes:
with as many threads as cores, both may share the free core while the busy one runs only
the other process (this process then gets one core of two); with one more, each core runs
two threads and this process gets one and a half (measured at n = 20,000 beside one busy
core: later calls 0.91 s with two threads, 0.86 s with three, 0.81 s with four).

A count the user set always wins, and is then used as it is: ``PML_NUM_THREADS=n`` in the
environment (``0``: leave PyTorch's count alone, never measure), ``OMP_NUM_THREADS`` or
``MKL_NUM_THREADS``, or ``torch.set_num_threads(n)`` called after this module was imported
(a count that differs from the one PyTorch had then).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator

import torch

from .errors import InvalidArgumentError

__all__ = [
    "ENV",
    "MIN_PAIRS",
    "adapted_threads",
    "choose_threads",
    "dynamic_threads",
    "free_cores",
    "one_torch_thread",
    "user_threads",
]

logger = logging.getLogger(__name__)

ENV = "PML_NUM_THREADS"
# Seconds over which the load of the cores is measured (4 ticks of the kernel's 100 Hz
# accounting: an idle core reads 0 busy ticks, one taken by another process about 4).
WINDOW = 0.04
# Computations of fewer query-reference pairs run on PyTorch's count as it is: the
# measurement (WINDOW) would cost them more than a busy core (about 0.3 s of search on two
# idle cores at this size, 2^28 pairs: n = 16,384 searched against itself).
MIN_PAIRS = 2**28
# A core counts as free when at least this much of it is: a core shared half-and-half
# would still hold up every parallel operation.
FREE_FRACTION = 0.75
# A measurement serves the calls that start within this many seconds of it.
REUSE_SECONDS = 1.0
# Environment variables through which users set OpenMP's (and so PyTorch's) thread count.
OPENMP_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_TORCH_THREADS_AT_IMPORT = torch.get_num_threads()
_state = {
    "depth": 0,
    "restore": 1,
    "chosen": 1,
    "dynamic": 1,
    "measured_at": -math.inf,
    "free": 0.0,
    "alone": 0,  # threads inside one_torch_thread
    "alone_restore": 1,  # PyTorch's count from before the first of them
}
_lock = threading.Lock()


def _reset_after_fork() -> None:
    """A forked child has none of its parent's other threads: none is inside
    :func:`adapted_threads` or :func:`one_torch_thread`, and none holds their lock."""
    global _lock
    _lock = threading.Lock()
    _state["depth"] = _state["alone"] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def user_threads() -> int | None:
    """The thread count the user set (``0``: the adaptation is off), or None if none was."""
    value = os.environ.get(ENV, "").strip()
    if value:
        if not value.isdigit():
            raise InvalidArgumentError(
                f"The {ENV} environment variable must be a non-negative integer "
                f"(0 keeps PyTorch's thread count). Got {value!r} instead."
            )
        return int(value)
    if any(os.environ.get(name, "").strip() for name in OPENMP_ENVS):
        return torch.get_num_threads()
    if torch.get_num_threads() != _TORCH_THREADS_AT_IMPORT:
        return torch.get_num_threads()
    return None


def free_cores(window: float = WINDOW) -> float | None:
    """How many of this process's cores other processes left free over the next
    ``window`` seconds (this process's own CPU time does not count); None where
    ``/proc/stat`` cannot be read (or, as on macOS and Windows, does not exist)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    before, own_before, start = _busy_seconds(cpus), time.process_time(), time.monotonic()
    if before is None:
        return None
    time.sleep(window)
    after, own_after = _busy_seconds(cpus), time.process_time()
    elapsed = time.monotonic() - start
    if after is None or elapsed <= 0:
        return None
    others = max(0.0, (after - before) - (own_after - own_before))
    return max(0.0, len(cpus) - others / elapsed)


def _busy_seconds(cpus: set[int]) -> float | None:
    """CPU seconds that ``cpus`` spent busy (user, system, interrupts, steal) since boot."""
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
                    busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return busy / ticks


def choose_threads() -> int:
    """The threads for a large computation now: the user's count if one was set, else
    PyTorch's count capped by the cores free now (at least one)."""
    chosen = user_threads()
    current = torch.get_num_threads()
    if chosen is not None:
        return chosen or current
    if current == 1:
        return 1
    now = time.monotonic()
    if now - _state["measured_at"] > REUSE_SECONDS:
        free = free_cores()
        _state["free"] = float(current) if free is None else free
        _state["measured_at"] = now
    return max(1, min(current, math.floor(_state["free"] + 1 - FREE_FRACTION)))


@contextlib.contextmanager
def adapted_threads(pairs: int, device: torch.device) -> Iterator[int]:
    """Run the block on :func:`choose_threads` PyTorch threads and restore the count after,
    for a computation of ``pairs`` query-reference pairs on ``device``: only a CPU
    computation of ``MIN_PAIRS`` pairs or more is adapted, and the others run as they are.

    Blocks nested in one another (a search inside ``get_accuracy``), or running at once in
    several Python threads, share the first one's choice; the last to end restores the
    count from before the first. PyTorch's count is per thread (OpenMP's), so each block
    sets its own thread's count and, if others still run, puts back its own thread's.

    Example:
        >>> with adapted_threads(2**30, torch.device("cpu")) as threads:
        ...     threads >= 1
        True
    """
    if device.type != "cpu" or pairs < MIN_PAIRS:
        yield torch.get_num_threads()
        return
    with _lock:
        own = torch.get_num_threads()
        if _state["depth"] == 0:
            _state["restore"] = own
            user = user_threads()
            _state["chosen"] = choose_threads()
            busy = max(0, own - _state["chosen"])
            _state["dynamic"] = user or own + busy
            if _state["chosen"] != own:
                logger.debug("running on %d of %d threads", _state["chosen"], own)
        if own != _state["chosen"]:
            torch.set_num_threads(int(_state["chosen"]))
        _state["depth"] += 1
        threads = torch.get_num_threads()
    try:
        yield threads
    finally:
        with _lock:
            _state["depth"] -= 1
            back = _state["restore"] if _state["depth"] == 0 else own
            if torch.get_num_threads() != back:
                torch.set_num_threads(int(back))


def dynamic_threads() -> int:
    """Threads for work handed out piece by piece to whichever thread is free: the user's
    count, else PyTorch's count from before :func:`adapted_threads` lowered it, plus one
    per core it left out as busy.

    A thread that shares its core with another process only takes fewer pieces, so such
    work gains from every core, busy or not.
    """
    with _lock:
        if _state["depth"] > 0:
            return int(_state["dynamic"])
    return torch.get_num_threads()


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """PyTorch's intra-op threads set to one on this thread for the block, then restored.

    ``torch.set_num_threads`` sets the calling thread's OpenMP count (and the count that
    threads new to PyTorch start with), so each thread that must run alone (the compiled
    search's, each computing whole tiles) sets and restores its own. The last thread to
    leave restores the count from before the first entered, so that a thread new to
    PyTorch, which started on one thread meanwhile, does not leave one behind.
    """
    with _lock:
        if _state["alone"] == 0:
            _state["alone_restore"] = torch.get_num_threads()
        _state["alone"] += 1
        own = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        yield
    finally:
        with _lock:
            _state["alone"] -= 1
            back = _state["alone_restore"] if _state["alone"] == 0 else own
            torch.set_num_threads(int(back))
