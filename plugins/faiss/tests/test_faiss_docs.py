"""The Python examples in the plugin's README and in docs/faiss.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.faiss

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = [ROOT / "plugins" / "faiss" / "README.md", ROOT / "docs" / "faiss.md"]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: path.name)
def test_python_examples_run(path: Path) -> None:
    blocks = _python_blocks(path)
    assert blocks
    for block in blocks:
        exec(compile(block, str(path), "exec"), {})


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: path.name)
def test_macos_note_names_both_variables(path: Path) -> None:
    text = path.read_text()
    assert "KMP_DUPLICATE_LIB_OK=TRUE" in text and "OMP_NUM_THREADS=1" in text
    assert "CustomKNN" in text and "-e . -e plugins/faiss" in text
