"""The training page is one page: its nav title is its title, nothing links the old page,
and it states what survives a crash."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_nav_title_is_the_page_title() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    titles = re.findall(r"^\s*- (.+): training\.md\s*$", nav, flags=re.M)
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert titles == [page.splitlines()[0].removeprefix("# ")]
    assert "training_loop.md" not in nav


def test_no_link_to_the_merged_page() -> None:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    assert [p for p in pages if "training_loop.md" in p.read_text(encoding="utf-8")] == []
    assert not (ROOT / "docs" / "training_loop.md").exists()


def test_the_page_states_the_crash_guarantees() -> None:
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = page.split("## What survives a crash", 1)[1].split("\n## ", 1)[0]
    promises = ["os.replace", "superseded_records", "ResumeError", "FileWriteError", "umask"]
    assert [p for p in promises if p not in section] == []
    assert "start_fresh=True" in page
