"""Reading embeddings, labels and scores from every supported file format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.cli.loaders import (
    InputFileError,
    load_array,
    load_embeddings,
    load_labels,
    load_match_labels,
    load_scores,
)

EMBEDDINGS = np.array([[0.5, -1.0, 2.0], [3.25, 0.0, 1.0]], dtype=np.float32)


def write(path: Path, array: np.ndarray, header: str | None = None) -> Path:
    """Write ``array`` in the format named by ``path``'s suffix."""
    suffix = path.suffix
    if suffix == ".npy":
        np.save(path, array)
    elif suffix == ".npz":
        np.savez(path, array)
    elif suffix in (".pt", ".pth"):
        torch.save(torch.from_numpy(np.ascontiguousarray(array)), path)
    else:
        rows = array.reshape(len(array), -1)
        lines = [header] if header else []
        lines += [",".join(str(value) for value in row) for row in rows]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".pt", ".pth", ".csv"])
def test_embeddings_round_trip(tmp_path: Path, suffix: str) -> None:
    path = write(tmp_path / f"e{suffix}", EMBEDDINGS)
    loaded = load_embeddings(path)
    # a CSV's decimal numbers are read as float64, as a float64 .npy of them would be
    assert loaded.dtype == (torch.float64 if suffix == ".csv" else torch.float32)
    assert loaded.tolist() == EMBEDDINGS.tolist()


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".pt", ".csv"])
def test_integer_labels_round_trip(tmp_path: Path, suffix: str) -> None:
    path = write(tmp_path / f"l{suffix}", np.array([3, 1, 3, 7]))
    labels = load_labels(path, num_rows=4)
    assert labels.dtype == torch.long
    assert labels.tolist() == [3, 1, 3, 7]


def test_float64_embeddings_stay_float64(tmp_path: Path) -> None:
    path = write(tmp_path / "e.npy", EMBEDDINGS.astype(np.float64))
    assert load_embeddings(path).dtype == torch.float64


def test_csv_header_is_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "e.csv", EMBEDDINGS, header="x,y,z")
    assert load_embeddings(path).tolist() == EMBEDDINGS.tolist()


def test_string_labels_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("# species\nzebra\nant\nzebra\nmole\n")
    assert load_labels(path).tolist() == [2, 0, 2, 1]
    np.save(tmp_path / "labels.npy", np.array(["b", "a", "b"]))
    assert load_labels(tmp_path / "labels.npy").tolist() == [1, 0, 1]


def test_column_vector_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "l.npy", np.array([[1], [2]]))
    assert load_labels(path).tolist() == [1, 2]


def test_integral_float_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "l.npy", np.array([1.0, 2.0]))
    assert load_labels(path).tolist() == [1, 2]


def test_npz_with_named_arrays(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, embeddings=EMBEDDINGS, labels=np.array([4, 5]), other=np.zeros(2))
    assert load_embeddings(path).tolist() == EMBEDDINGS.tolist()
    assert load_labels(path).tolist() == [4, 5]
    assert load_array(f"{path}:other").tolist() == [0.0, 0.0]


def test_pt_dict_with_key(tmp_path: Path) -> None:
    path = tmp_path / "data.pt"
    torch.save({"query": torch.from_numpy(EMBEDDINGS), "ids": torch.tensor([1, 2])}, path)
    assert load_embeddings(f"{path}:query").tolist() == EMBEDDINGS.tolist()
    assert load_labels(f"{path}:ids").tolist() == [1, 2]


def test_pt_list_of_labels(tmp_path: Path) -> None:
    path = tmp_path / "labels.pt"
    torch.save([0, 1, 1], path)
    assert load_labels(path).tolist() == [0, 1, 1]


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".pt", ".csv"])
def test_scores(tmp_path: Path, suffix: str) -> None:
    values = np.array([0.25, -1.5, 3.0])
    loaded = load_scores(write(tmp_path / f"s{suffix}", values))
    assert loaded.dtype == torch.float64
    assert loaded.tolist() == values.tolist()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1\n0\n1\n", [True, False, True]),
        ("same\ntrue\nFalse\n", [True, True, False]),
        ("yes\nno\nmatch\n", [True, False, True]),
    ],
)
def test_match_labels_from_csv(tmp_path: Path, text: str, expected: list[bool]) -> None:
    path = tmp_path / "m.csv"
    path.write_text(text)
    assert load_match_labels(path, 3).tolist() == expected


def test_match_labels_from_bool_npy(tmp_path: Path) -> None:
    path = write(tmp_path / "m.npy", np.array([True, False]))
    assert load_match_labels(path, 2).tolist() == [True, False]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.npy", "does not exist"),
        (lambda d: write(d / "e.txt", EMBEDDINGS), "must end with one of .npy, .npz"),
        (lambda d: write(d / "e.npy", EMBEDDINGS[0]), "must be a 2-D array (rows, dims)"),
        (lambda d: write(d / "e.npy", np.zeros((2, 2, 2))), "Got shape (2, 2, 2)"),
        (lambda d: write(d / "e.npy", np.array([[1.0, np.nan]])), "NaN or infinite"),
        (lambda d: write(d / "e.npy", np.array([["a", "b"]])), "must be numbers"),
        (lambda d: write(d / "e.npy", np.zeros((0, 3))), "are empty"),
    ],
)
def test_embedding_errors(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(InputFileError, match=_literal(message)):
        load_embeddings(make(tmp_path))


def test_ragged_csv(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("1,2\n3\n")
    with pytest.raises(InputFileError, match="different numbers of columns"):
        load_embeddings(path)


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "e.npy"
    path.write_bytes(b"not numpy at all")
    with pytest.raises(InputFileError, match="Cannot read the embeddings file"):
        load_embeddings(path)


def test_labels_of_another_length(tmp_path: Path) -> None:
    path = write(tmp_path / "l.npy", np.array([1, 2, 3]))
    with pytest.raises(InputFileError, match="have 3 rows but the data they label has 2"):
        load_labels(path, num_rows=2)


def test_non_integer_labels(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="must be integers or names"):
        load_labels(write(tmp_path / "l.npy", np.array([0.5, 1.0])))


def test_two_dimensional_labels(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="must be a 1-D array"):
        load_labels(write(tmp_path / "l.npy", np.zeros((3, 2), dtype=int)))


def test_npz_needs_a_key_when_ambiguous(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, a=EMBEDDINGS, b=EMBEDDINGS)
    with pytest.raises(InputFileError, match=_literal("holds several arrays ['a', 'b']")):
        load_embeddings(path)
    with pytest.raises(InputFileError, match=_literal("has no array 'c'. It has: ['a', 'b']")):
        load_embeddings(f"{path}:c")


def test_key_after_a_single_array_file(tmp_path: Path) -> None:
    path = write(tmp_path / "e.pt", EMBEDDINGS)
    with pytest.raises(InputFileError, match="holds one tensor"):
        load_embeddings(f"{path}:x")


def test_unknown_match_labels(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("1\nmaybe\n")
    with pytest.raises(InputFileError, match="must say whether each pair matches"):
        load_match_labels(path, 2)


def _literal(text: str) -> str:
    import re

    return re.escape(text)


def test_a_folder_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="is a folder; give the file in it"):
        load_embeddings(tmp_path)
