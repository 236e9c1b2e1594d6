"""Every ```python block of README.md and docs/**/*.md runs, in order, one namespace per file.

- Blocks of one file share their variables, as a reader following the page would; then
  every ``test_*`` function they defined is called.
- A block right under a line ``**`some/path`**`` is a file of a worked example. Such files
  are written into a temporary project first; if one is a ``pyproject.toml``, the project
  is made importable and its entry points visible, as if it were ``pip install``-ed, so the
  page can use its backends by name.
- A file whose Python blocks mention faiss, or that carries the comment
  ``<!-- docs-test: faiss -->``, runs only in the faiss session (``-m faiss``).
- A file that carries the comment ``<!-- docs-test: lightning -->`` is skipped when
  lightning (the ``lightning`` extra) is not installed.
- Blocks run in a temporary working folder.
- Libraries that a worked example wraps but that are not installed (hnswlib) are imported
  from stand-ins in tests/fakes/, which come last on ``sys.path``.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytorch_metric_learning.evaluation.search import registry

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*)$")
FILE_LABEL = re.compile(r"^\*\*`(?P<path>[^`]+)`\*\*$")
FAISS_MARKER = "<!-- docs-test: faiss -->"
LIGHTNING_MARKER = "<!-- docs-test: lightning -->"
# Stand-ins for optional libraries the docs' examples wrap (hnswlib), used when not installed.
FAKES = ROOT / "tests" / "fakes"


@dataclass(frozen=True)
class Block:
    line: int
    language: str
    code: str
    file: str | None = None


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path for path in files if path.is_file()]


def fenced_blocks(text: str) -> Iterator[Block]:
    """Every fenced block with its first line number, language and file label."""
    lines, index, label = text.splitlines(), 0, None
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            if lines[index].strip():
                found = FILE_LABEL.match(lines[index].strip())
                label = found["path"] if found else None
            index += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = "\n".join(_unindent(line, indent) for line in lines[index + 1 : end])
        language = (opening["info"].split() or [""])[0].lower()
        yield Block(index + 2, language, textwrap.dedent(body), label)
        index, label = end + 1, None


def python_blocks(text: str) -> list[Block]:
    return [block for block in fenced_blocks(text) if block.language in ("python", "py")]


def _unindent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line


def needs_faiss(text: str) -> bool:
    return FAISS_MARKER in text or any(
        re.search("faiss", b.code, re.I) for b in python_blocks(text)
    )


def _params() -> list[object]:
    params = []
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        if python_blocks(text):
            marks = [pytest.mark.faiss] if needs_faiss(text) else []
            params.append(pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks))
    return params


def install_example_project(text: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write the page's labelled files; fake-install the project if it has a pyproject."""
    files = {b.file: b.code for b in fenced_blocks(text) if b.file}
    if not files:
        return
    for name, code in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(code + "\n", encoding="utf-8")
    if "pyproject.toml" not in files:
        return
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(files["pyproject.toml"])["project"]
    info = folder / "site" / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project.get("entry-points", {})
    lines = [
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
        for group, points in groups.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))
    source = folder / "src" if (folder / "src").is_dir() else folder
    monkeypatch.syspath_prepend(str(source))
    monkeypatch.syspath_prepend(str(folder / "site"))


@pytest.fixture
def fresh_registry(tmp_path: Path) -> Iterator[None]:
    """Reset the registry, and forget the modules a page's example project defined.

    Only modules loaded from the temporary folder are dropped: removing a third-party
    module (protobuf's, say) and importing it again can crash its C extension.
    """
    registry._reset_for_tests()
    yield
    registry._reset_for_tests()
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.parametrize("path", _params())
def test_python_blocks_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None
) -> None:
    text = path.read_text(encoding="utf-8")
    if needs_faiss(text):
        pytest.importorskip("faiss")
        pytest.importorskip("pytorch_metric_learning_faiss")
    if LIGHTNING_MARKER in text:
        pytest.importorskip("lightning")
    install_example_project(text, tmp_path / "example", monkeypatch)
    monkeypatch.setattr(sys, "path", [*sys.path, str(FAKES)])  # real packages come first
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for block in python_blocks(text):
        # Leading newlines make tracebacks point at the Markdown file's own line numbers.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(path), "exec"), namespace)
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()


def test_block_extraction() -> None:
    text = "\n".join(
        [
            "```python",
            "x = 1",
            "```",
            "**`pkg/pyproject.toml`**",
            "",
            "```toml",
            "[x]",
            "```",
            "1. A step:",
            "",
            "    ```py",
            "    if x:",
            "        y = 2",
            "    ```",
        ]
    )
    assert list(fenced_blocks(text)) == [
        Block(2, "python", "x = 1"),
        Block(7, "toml", "[x]", "pkg/pyproject.toml"),
        Block(12, "py", "if x:\n    y = 2"),
    ]
    assert [block.line for block in python_blocks(text)] == [2, 12]


def test_the_documentation_has_code_to_run() -> None:
    assert any(python_blocks(path.read_text(encoding="utf-8")) for path in markdown_files())
