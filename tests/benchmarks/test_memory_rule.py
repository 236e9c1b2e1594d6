"""Every memory figure of the benchmarks and tests is a process's own peak.

``ru_maxrss`` of a child process includes its parent's peak (Linux carries it across
``fork`` and ``exec``): a benchmark that writes a 500 MB gallery and then measures a child
would report the parent's memory as the child's. The rule: peaks come from
``benchmarks/_memory.py`` (benchmarks) or ``tests/_peak.py`` (test scripts), never from
``ru_maxrss`` directly.
"""

from __future__ import annotations

import json
from pathlib import Path

from _peak import PEAK_SOURCE, needs_proc
from _subprocess import run_python

from ._scripts import BENCHMARKS, load_script

ROOT = BENCHMARKS.parent
ALLOWED = {BENCHMARKS / "_memory.py", ROOT / "tests" / "_peak.py", Path(__file__).resolve()}


def test_no_benchmark_or_test_reads_ru_maxrss_itself() -> None:
    found = [
        str(path.relative_to(ROOT))
        for folder in (ROOT / "benchmarks", ROOT / "tests")
        for path in sorted(folder.rglob("*.py"))
        if path.resolve() not in ALLOWED and "ru_maxrss" in path.read_text()
    ]
    assert found == [], f"read the peak through _memory.py / _peak.py: {found}"


def test_every_test_that_measures_a_childs_peak_fixes_its_threads() -> None:
    """A peak measured in a child follows the machine's load unless the child's thread
    count is fixed (``_peak.STEADY_THREADS``): on busy cores the searches add threads."""
    measuring = [
        path
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if path.resolve() not in ALLOWED
        and any(name in path.read_text() for name in ("PEAK_SOURCE", "peak_of_evaluate("))
    ]
    assert measuring, "no test measures a child's peak: the rule checks nothing"
    unsteady = [
        str(p.relative_to(ROOT)) for p in measuring if "STEADY_THREADS" not in p.read_text()
    ]
    assert unsteady == [], f"pass _peak.STEADY_THREADS to the measured children: {unsteady}"


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from _memory import peak_rss_bytes, rss_bytes
PEAK_SOURCE
print(json.dumps({"memory": peak_rss_bytes(), "peak": peak_bytes(), "now": rss_bytes()}))
"""


@needs_proc
def test_a_child_of_a_large_parent_reports_its_own_peak() -> None:
    """The parent touches 300 MiB before it starts the child: the child's peak, by both
    helpers, is its own (a Python interpreter: well under 100 MiB)."""
    load_script("_memory")  # importable as the benchmarks import it
    held = bytearray(300 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])  # every page resident
    script = CHILD.replace("PEAK_SOURCE", PEAK_SOURCE)
    done = run_python(script, str(BENCHMARKS))
    found = json.loads(done.stdout)
    assert len(held) == 300 * 2**20
    for name in ("memory", "peak", "now"):
        assert 0 < found[name] < 100 * 2**20, found
