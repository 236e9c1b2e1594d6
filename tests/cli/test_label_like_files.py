"""Files of group ids and categories are read as labels are, and every error they raise
names what they are and their option, never "labels" (whatever the file is called)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from pytorch_metric_learning.cli.loaders import InputFileError, read_label_like

ROLES = [("group ids", "--query-groups"), ("categories", "--query-categories")]


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
}


@pytest.mark.parametrize(("noun", "option"), ROLES)
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_every_error_names_the_role_and_the_option(
    tmp_path: Path, noun: str, option: str, kind: str
) -> None:
    source = BROKEN[kind](tmp_path)
    with pytest.raises(InputFileError) as error:
        read_label_like(source, 4, noun, option)
    message = str(error.value)
    assert f"{noun} ({option})" in message, message
    outside_names = re.sub(r"'[^']*'", "''", message).replace("the data they label", "")
    assert "label" not in outside_names.lower(), message


@pytest.mark.parametrize(("noun", "option"), ROLES)
def test_ids_read_as_labels_are(tmp_path: Path, noun: str, option: str) -> None:
    assert read_label_like(_npy([3, 1, 3, 2])(tmp_path), 4, noun, option).tolist() == [3, 1, 3, 2]
    names = _text("cam1\ncam2\ncam1\ncam3\n")(tmp_path)
    assert read_label_like(names, 4, noun, option).tolist() == ["cam1", "cam2", "cam1", "cam3"]
