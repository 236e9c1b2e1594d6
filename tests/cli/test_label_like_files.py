"""Files of group ids and categories are read as labels are, and every error they raise
names what they are and their option, never "labels" (whatever the file is called)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from pytorch_metric_learning.cli.loaders import (
    CATEGORIES,
    FileRole,
    InputFileError,
    group_role,
    read_label_like,
)

ROLES = [group_role("--query-groups"), group_role("--reference-groups"), CATEGORIES]


def _npy(values: object) -> Callable[[Path], str]:
    def write(folder: Path) -> str:
        path = folder / "labels.npy"  # a name that says "labels": it must stay as it is
        np.save(path, np.asarray(values))
        return str(path)

    return write


def _text(content: str, suffix: str = ".csv") -> Callable[[Path], str]:
    def write(folder: Path) -> str:
        path = folder / f"labels{suffix}"
        path.write_text(content)
        return str(path)

    return write


BROKEN = {
    "wrong length": _npy([1, 2, 3]),
    "float": _npy([1.0, 2.5, 3.0, 4.0]),
    "float csv": _text("1\n2.5\n3\n4\n"),
    "2-D": _npy([[1, 2], [3, 4]]),
    "bool": _npy([True, False, True, False]),
    "empty": _text(""),
    "missing": lambda folder: str(folder / "labels.npy"),
    "folder": lambda folder: str(folder),
    "complex": _npy([1j, 2j, 3j, 4j]),
    "npz: no such key": lambda folder: _npz(folder, {"labels": [1, 2, 3, 4]}) + ":cams",
    "npz: several arrays": lambda folder: _npz(folder, {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}),
    "pt: no such key": lambda folder: _pt(folder, {"labels": [1, 2, 3, 4]}) + ":cams",
    "pt: several tensors": lambda folder: _pt(folder, {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}),
    "pt: a key on one tensor": lambda folder: _pt(folder, [1, 2, 3, 4]) + ":cams",
    "npy: a key": lambda folder: _npy([1, 2, 3, 4])(folder) + ":cams",
    "pt: not a tensor": lambda folder: _pt(folder, "text"),
    "unknown suffix": _text("1\n2\n3\n4\n", ".txt"),
    "float pt": lambda folder: _pt(folder, [1.0, 2.5, 3.0, 4.0]),
    "header only": _text("camera,category\n"),
}


def _npz(folder: Path, arrays: dict[str, list[int]]) -> str:
    path = folder / "labels.npz"
    np.savez(path, **{key: np.asarray(value) for key, value in arrays.items()})
    return str(path)


def _pt(folder: Path, content: object) -> str:
    path = folder / "labels.pt"
    if isinstance(content, dict):
        content = {key: torch.tensor(value) for key, value in content.items()}
    elif isinstance(content, list):
        content = torch.tensor(content)
    torch.save(content, path)
    return str(path)


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.option)
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_every_error_names_the_role_and_the_option(
    tmp_path: Path, role: FileRole, kind: str
) -> None:
    source = BROKEN[kind](tmp_path)
    with pytest.raises(InputFileError) as error:
        read_label_like(source, 4, role)
    message = str(error.value)
    assert role.what in message, message
    outside_names = re.sub(r"'[^']*'", "''", message).replace("the data they label", "")
    assert "label" not in outside_names.lower(), message
    if "float" in kind:  # the singular noun as given, never cut from the plural
        assert f"a float {role.singular} must" in message, message


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.option)
def test_ids_read_as_labels_are(tmp_path: Path, role: FileRole) -> None:
    assert read_label_like(_npy([3, 1, 3, 2])(tmp_path), 4, role).tolist() == [3, 1, 3, 2]
    names = _text("cam1\ncam2\ncam1\ncam3\n")(tmp_path)
    assert read_label_like(names, 4, role).tolist() == ["cam1", "cam2", "cam1", "cam3"]


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.option)
def test_a_several_array_file_is_read_under_the_roles_own_key(tmp_path: Path, role) -> None:
    """An .npz or .pt holding labels and this role's array reads the role's array, never
    the labels (a silent wrong file otherwise)."""
    arrays = {"labels": [7, 7, 7, 7], role.key: [1, 2, 1, 2]}
    for source in (_npz(tmp_path, arrays), _pt(tmp_path, arrays)):
        assert read_label_like(source, 4, role).tolist() == [1, 2, 1, 2]


GROUP_HEADERS = ["camera", "Camera", "cam", "camid", "cam_id", "camera_id", "group", "groups"]
CATEGORY_HEADERS = ["category", "Category", "super_category", "categories"]
HEADER_CASES = [(group_role("--query-groups"), name) for name in GROUP_HEADERS] + [
    (CATEGORIES, name) for name in CATEGORY_HEADERS
]


@pytest.mark.parametrize(("role", "header"), HEADER_CASES)
@pytest.mark.parametrize("values", [["c1", "c2", "c1"], [1, 2, 1]])
def test_a_header_line_is_skipped_as_in_a_labels_file(tmp_path, role, header, values) -> None:
    """A first line that is the usual name of the column (over names), or any name over
    numbers, is a header, as in a labels file."""
    source = _text(header + "\n" + "".join(f"{value}\n" for value in values))(tmp_path)
    assert read_label_like(source, 3, role).tolist() == values


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.option)
def test_an_unknown_header_over_names_gets_a_hint(tmp_path: Path, role: FileRole) -> None:
    """Over names, an unusual first line is a value, as in a labels file; the length
    error then says how to read it as a header, and that way works."""
    source = _text("Kamera\nc1\nc2\nc1\n")(tmp_path)
    with pytest.raises(InputFileError, match=r"first line \('Kamera'\) is a header") as error:
        read_label_like(source, 3, role)
    assert role.what in str(error.value)
    assert read_label_like(f"{source}:Kamera", 3, role).tolist() == ["c1", "c2", "c1"]
