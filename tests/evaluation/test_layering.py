"""The rooms of ``evaluation/`` import only downward, read from the source with ``ast``.

Every import statement counts, also those inside functions: a lazy import upward is still
an arrow upward in the drawing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytorch_metric_learning

PACKAGE_DIR = Path(pytorch_metric_learning.__file__).parent
ROOT = "pytorch_metric_learning"
EVAL = f"{ROOT}.evaluation"

# room -> the evaluation rooms it must not import
FORBIDDEN_ROOMS = {
    "search": ("retrieval", "verification", "clustering", "distributed"),
    "clustering": ("retrieval", "verification", "distributed"),
    "verification": ("search", "retrieval", "clustering", "distributed"),
    "retrieval": ("verification", "distributed"),
}
# nothing in evaluation/ reaches up to these layers or these optional libraries
FORBIDDEN_FOR_EVALUATION = (
    f"{ROOT}.testers",
    f"{ROOT}.trainers",
    f"{ROOT}.utils",
    f"{ROOT}.plots",
    f"{ROOT}.cli",
    "faiss",
    "matplotlib",
    "sklearn",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (``from x import y`` gives x and x.y)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_resolver_reads_relative_imports() -> None:
    knn = PACKAGE_DIR / "evaluation" / "search" / "knn.py"
    found = imported_modules(knn)
    assert f"{ROOT}.distances" in found
    assert f"{EVAL}.search._compiled_topk" in found


def test_every_room_exists_and_says_what_it_holds() -> None:
    for room in (*FORBIDDEN_ROOMS, "distributed"):
        init = PACKAGE_DIR / "evaluation" / room / "__init__.py"
        assert init.is_file(), room
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring.splitlines()) >= 2, room


@pytest.mark.parametrize("room", sorted(FORBIDDEN_ROOMS))
def test_rooms_import_only_downward(room: str) -> None:
    others = tuple(f"{EVAL}.{other}" for other in FORBIDDEN_ROOMS[room])
    assert imports_into(f"evaluation/{room}", others) == []


def imports_into(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    """Every import, under ``folder`` of the package, of a module within ``forbidden``."""
    return [
        f"{module_name(path)} imports {name}"
        for path in sorted((PACKAGE_DIR / folder).rglob("*.py"))
        for name in sorted(imported_modules(path))
        if any(within(name, prefix) for prefix in forbidden)
    ]


def test_evaluation_imports_no_layer_above_it() -> None:
    assert imports_into("evaluation", FORBIDDEN_FOR_EVALUATION) == []


def test_distances_import_nothing_of_evaluation() -> None:
    assert imports_into("distances", (EVAL,)) == []


def test_no_module_is_left_flat_in_evaluation() -> None:
    flat = sorted(p.name for p in (PACKAGE_DIR / "evaluation").glob("*.py"))
    assert flat == ["__init__.py"]
