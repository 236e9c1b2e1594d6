"""No test can wait forever: every wait on another process or thread in the test code has
a time limit, so a stuck child fails its own test, named, instead of holding the suite
(pytest-timeout's per-test limit in pyproject.toml is the net under this rule)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_FOLDERS = [ROOT / "tests", *sorted((ROOT / "plugins").glob("*/tests"))]
# subprocess functions that wait for the child to end
SUBPROCESS_WAITS = {"run", "call", "check_call", "check_output"}
# methods that block until another thread or process is done (a bare .join() on a str is
# a join of strings, and takes an argument: never flagged)
BLOCKING_METHODS = {"wait", "join", "communicate", "result"}


def _python_files() -> list[Path]:
    return sorted(path for folder in TEST_FOLDERS for path in folder.rglob("*.py"))


def _has_limit(call: ast.Call, positional_limit_at: int | None) -> bool:
    if any(keyword.arg == "timeout" for keyword in call.keywords):
        return True
    return positional_limit_at is not None and len(call.args) > positional_limit_at


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of each call in ``source`` that may wait forever."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else None
        if owner_name == "subprocess" and name in SUBPROCESS_WAITS:
            if not _has_limit(node, None):
                found.append((node.lineno, f"subprocess.{name} without timeout="))
        elif owner_name == "mp" and name == "spawn":
            found.append((node.lineno, "mp.spawn (use _gloo.spawn_ranks, which has a deadline)"))
        elif name in BLOCKING_METHODS and not node.args and not node.keywords:
            found.append((node.lineno, f".{name}() without a timeout"))
    return found


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_wait_has_a_time_limit(path: Path) -> None:
    assert unbounded_waits(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("code", "flagged"),
    [
        ("subprocess.run(['x'])", True),
        ("subprocess.run(['x'], timeout=5)", False),
        ("subprocess.check_output(['x'])", True),
        ("process.wait()", True),
        ("process.wait(timeout=5)", False),
        ("thread.join()", True),
        ("thread.join(5)", False),
        ("', '.join(names)", False),
        ("future.result()", True),
        ("mp.spawn(f, nprocs=2)", True),
        ("subprocess.Popen(['x'])", False),
    ],
)
def test_the_rule_flags_what_it_should(code: str, flagged: bool) -> None:
    assert bool(unbounded_waits(code)) is flagged
