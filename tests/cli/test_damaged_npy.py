"""Damaged ``.npy`` files are refused with what is wrong with them, in every role.

numpy's own messages for these speak of pickles (a file that is not a ``.npy`` at all) or
of mmap lengths (one cut short): the CLI says which file, what was found and what it
expected instead.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning.cli.loaders import InputFileError, load_array


def saved(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


FLOATS = saved(np.arange(200, dtype=np.float32).reshape(50, 4))
HEADER = len(FLOATS) - 800  # 50 x 4 float32 after the header

DAMAGED = {
    "not a .npy": (b"garbage\n", "not a .npy file"),
    "empty": (b"", "not a .npy file"),
    "a text file": (b"0.1,0.2\n0.3,0.4\n", "not a .npy file"),
    "data cut short": (FLOATS[: HEADER + 172], "truncated"),
    "no data": (FLOATS[:HEADER], "truncated"),
    "one byte short": (FLOATS[:-1], "truncated"),
    "Python objects": (saved(np.array([{"a": 1}] * 5, dtype=object)), "Python objects"),
}


@pytest.mark.parametrize("role", ["embeddings", "labels", "groups", "categories"])
@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_npy_is_refused_with_what_was_found(tmp_path: Path, case: str, role: str):
    content, expected = DAMAGED[case]
    path = tmp_path / "damaged.npy"
    path.write_bytes(content)
    with pytest.raises(InputFileError) as raised:
        load_array(path, role)
    message = str(raised.value)
    assert "damaged.npy" in message and expected in message, message
    assert "pickle" not in message and "mmap" not in message, message


@pytest.mark.parametrize("role", ["embeddings", "labels"])
def test_a_whole_npy_is_still_read(tmp_path: Path, role: str):
    path = tmp_path / "whole.npy"
    path.write_bytes(FLOATS)
    assert np.array_equal(load_array(path, role), np.arange(200, dtype=np.float32).reshape(50, 4))
