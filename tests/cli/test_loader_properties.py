"""Every format reads any integer or float array exactly, or refuses it with one message."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytorch_metric_learning.cli.app import EXIT_INPUT, EXIT_USAGE, main
from pytorch_metric_learning.cli.loaders import (
    InputFileError,
    load_array,
    load_embeddings,
    load_labels,
    load_scores,
    read_labels,
)

FORMATS = ["npy", "npz", "pt", "csv", "csv-header", "csv-quoted", "csv-bom"]
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _csv_cell(value: object, quoted: bool) -> str:
    text = repr(float(value)) if isinstance(value, float) else str(int(value))  # type: ignore[call-overload]
    return f'"{text}"' if quoted else text


def write_any(folder: Path, array: np.ndarray, form: str) -> Path:
    """Write ``array`` (2-D) the way a user would in ``form``, independently of the loader."""
    if form == "npy":
        path = folder / "a.npy"
        np.save(path, array)
    elif form == "npz":
        path = folder / "a.npz"
        np.savez(path, array)
    elif form == "pt":
        path = folder / "a.pt"
        torch.save(torch.from_numpy(array.copy()), path)
    else:
        path = folder / "a.csv"
        lines = [",".join(f"c{i}" for i in range(array.shape[1]))] if form != "csv" else []
        for row in array.tolist():
            lines.append(",".join(_csv_cell(value, form == "csv-quoted") for value in row))
        text = "\n".join(lines) + "\n"
        path.write_bytes(("\ufeff" if form == "csv-bom" else "").encode() + text.encode())
    return path


INTEGERS = hnp.arrays(
    np.int64,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=4),
    elements=st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**54), 2**54),
)
FLOATS = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=4),
    elements=st.floats(allow_nan=False, allow_infinity=False, width=64),
)


@SETTINGS
@given(array=INTEGERS, form=st.sampled_from(FORMATS))
def test_integers_are_read_exactly(tmp_path: Path, array: np.ndarray, form: str) -> None:
    loaded = load_array(write_any(tmp_path, array, form))
    assert loaded.dtype.kind == "i"
    assert loaded.tolist() == array.tolist()  # Python ints: no rounding hides a difference


@SETTINGS
@given(array=FLOATS, form=st.sampled_from(FORMATS))
def test_floats_are_read_exactly(tmp_path: Path, array: np.ndarray, form: str) -> None:
    loaded = load_array(write_any(tmp_path, array, form))
    assert loaded.dtype.kind == "f"
    # a float array whose values all look whole still reads as floats in every format
    assert loaded.astype(np.float64).tolist() == array.tolist()


@SETTINGS
@given(
    array=FLOATS,
    bad=st.sampled_from([np.inf, -np.inf, np.nan]),
    form=st.sampled_from(FORMATS),
)
def test_non_finite_is_refused_the_same_way(
    tmp_path: Path, array: np.ndarray, bad: float, form: str
) -> None:
    array = array.copy()
    array.flat[0] = bad
    path = write_any(tmp_path, array, form)
    with pytest.raises(InputFileError, match=re.escape(f"'{path}' contain NaN or infinite")):
        load_embeddings(path)


@pytest.mark.parametrize("cell", ["inf", "-inf", "nan", "Infinity"])
def test_csv_non_finite_without_a_dot(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "e.csv"
    path.write_text(f"1,2\n3,{cell}\n")
    with pytest.raises(InputFileError, match="NaN or infinite"):
        load_embeddings(path)


def test_big_integer_labels_stay_distinct(tmp_path: Path) -> None:
    path = tmp_path / "l.csv"
    path.write_text("9007199254740992\n9007199254740993\n")
    assert read_labels(path).tolist() == [9007199254740992, 9007199254740993]


@pytest.mark.parametrize("cell", ["7e20", "-7e20"])
def test_float_labels_out_of_range_are_refused(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "l.csv"
    path.write_text(f"1\n{cell}\n")
    with pytest.raises(InputFileError, match=re.escape(f"'{path}'") + ".*2\\^53"):
        read_labels(path)


def test_integers_beyond_uint64_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.csv"
    path.write_text(f"1\n{2**64}\n")
    with pytest.raises(InputFileError, match=re.escape(f"'{path}'") + ".*Got 18446744073709551616"):
        read_labels(path)


def test_uint64_labels_keep_their_values(tmp_path: Path) -> None:
    path = tmp_path / "l.npy"
    np.save(path, np.array([2**63, 2**63 + 1, 2**63], dtype=np.uint64))
    assert read_labels(path).tolist() == [2**63, 2**63 + 1, 2**63]
    assert load_labels(path).tolist() == [0, 1, 0]


@pytest.mark.parametrize("role", ["embeddings", "labels", "scores"])
def test_header_only_csv(tmp_path: Path, role: str) -> None:
    path = tmp_path / "h.csv"
    path.write_text("label\n" if role == "labels" else "x,y\n")
    load = {"embeddings": load_embeddings, "labels": load_labels, "scores": load_scores}[role]
    with pytest.raises(
        InputFileError, match=re.escape(f"'{path}' has a header line") + ".*no rows"
    ):
        load(path)


def test_csv_column_by_header_name(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("x,y,label\n0.5,1,cat\n2,3,dog\n")
    assert read_labels(f"{path}:label").tolist() == ["cat", "dog"]
    assert load_array(f"{path}:x").tolist() == [[0.5], [2.0]]
    with pytest.raises(InputFileError, match=re.escape("has no column 'z'") + ".*'label'"):
        read_labels(f"{path}:z")


def test_text_labels_with_a_header_line(tmp_path: Path) -> None:
    path = tmp_path / "l.csv"
    path.write_text("label\ncat\ndog\ncat\n")
    assert read_labels(path).tolist() == ["cat", "dog", "cat"]


def test_a_fifo_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('1,2\\n3,4\\n')"]
    )
    try:
        assert load_embeddings(fifo).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    finally:
        _end(writer)


def test_a_npy_fifo_is_read(tmp_path: Path) -> None:
    source = tmp_path / "a.npy"
    np.save(source, np.array([[1.5, 2.0]]))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = f"open({str(fifo)!r}, 'wb').write(open({str(source)!r}, 'rb').read())"
    writer = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert load_embeddings(fifo).tolist() == [[1.5, 2.0]]
    finally:
        _end(writer)


def _end(writer: subprocess.Popen[bytes]) -> None:
    """Wait for a FIFO's writer; one still blocked (nobody opened the FIFO) is killed."""
    try:
        writer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        writer.kill()
        writer.wait(timeout=10)
        raise


def test_a_device_is_not_a_regular_file() -> None:
    with pytest.raises(InputFileError, match="'/dev/null' is not a regular file"):
        load_embeddings("/dev/null")


def test_stdin_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from pytorch_metric_learning.cli import loaders

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"0\n1\n0\n")))
    loaders._stdin_bytes.cache_clear()  # standard input is read once per process
    try:
        assert read_labels("-").tolist() == [0, 1, 0]
        assert read_labels("-").tolist() == [0, 1, 0]  # a second reader gets the same bytes
    finally:
        loaders._stdin_bytes.cache_clear()


def test_cli_names_the_file_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = tmp_path / "q.csv"
    query.write_text("x,y\n")
    assert main(["evaluate", str(query), "--labels", str(query)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"'{query}' has a header line" in err and "Traceback" not in err


def test_cli_deep_knn_nesting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["evaluate", "q.npy", "--labels", "l.npy", "--knn", "[" * 100_000])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "--knn" in err and "nested too deeply" in err and "Traceback" not in err


# A label cell: an integer written as one, or written as a float in one of these styles.
_STYLES = ["int", "dot", "exp", "sci", "half"]


def _label_cell(value: int, style: str) -> str:
    if style == "int":
        return str(value)
    if style == "dot":
        return f"{value}.0"
    if style == "exp":
        return f"{value}e0"
    if style == "sci":  # every digit kept: 9007199254740993 -> 9.007199254740993e15
        digits = str(abs(value))
        sign = "-" if value < 0 else ""
        return f"{sign}{digits[0]}.{digits[1:] or '0'}e{len(digits) - 1}"
    return f"{value}.5"


@SETTINGS
@given(
    cells=st.lists(
        st.tuples(
            st.integers(min_value=-(2**62), max_value=2**62)
            | st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 1]),
            st.sampled_from(_STYLES),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_mixed_label_columns_follow_one_rule(tmp_path: Path, cells: list[tuple[int, str]]) -> None:
    """Integers written as integers are exact; a float cell only if whole and <= 2^53."""
    path = tmp_path / "l.csv"
    path.write_text("".join(_label_cell(value, style) + "\n" for value, style in cells))
    refused = any(
        style == "half" or (style != "int" and abs(value) > 2**53) for value, style in cells
    )
    if refused:
        with pytest.raises(InputFileError, match=re.escape(f"'{path}'") + ".*2\\^53"):
            read_labels(path)
    else:
        assert read_labels(path).tolist() == [value for value, _ in cells]


@SETTINGS
@given(value=st.integers(min_value=-(2**60), max_value=2**60), form=st.sampled_from(["npy", "pt"]))
def test_float_labels_follow_the_csv_rule(tmp_path: Path, value: int, form: str) -> None:
    """A float64 label in .npy/.pt is accepted exactly when the CSV cell ``VALUE.0`` is."""
    as_float = float(value)
    binary = write_any(tmp_path, np.array([[as_float]]), form)
    text = tmp_path / "l.csv"
    text.write_text(f"{int(as_float)}.0\n")
    if abs(int(as_float)) > 2**53:
        for path in (binary, text):
            with pytest.raises(InputFileError, match="2\\^53"):
                read_labels(path)
    else:
        assert read_labels(binary).tolist() == read_labels(text).tolist() == [int(as_float)]


@pytest.mark.parametrize("cell", ["１", "١", "1_000", "1_0.5"])
def test_only_ascii_digits_are_numbers(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "l.csv"
    path.write_text(f"0\n{cell}\n")
    assert read_labels(path).tolist() == ["0", cell]  # names, as any non-number


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["compare", "-", "-", "--labels", "l.npy"], "A_QUERY and B_QUERY"),
        (["evaluate", "-", "--labels", "-"], "QUERY and --labels"),
    ],
)
def test_stdin_for_one_input_only(
    argv: list[str], options: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert options in err and "standard input" in err and "Traceback" not in err


@SETTINGS
@given(
    array=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=4),
        elements=st.floats(allow_nan=False, allow_infinity=False, width=64),
    ),
    form=st.sampled_from(["csv", "csv-header", "csv-quoted"]),
)
def test_csv_embeddings_equal_float64_npy(tmp_path: Path, array: np.ndarray, form: str) -> None:
    """A CSV of decimal numbers gives the same tensor, dtype included, as a float64 .npy."""
    if not np.any(array != np.round(array)):
        array = array + 0.5  # a decimal cell somewhere: an all-integer CSV is an integer array
    array = np.where(np.isfinite(array), array, 0.5)
    csv_path = write_any(tmp_path, array, form)
    npy_path = write_any(tmp_path, array, "npy")
    from_csv, from_npy = load_embeddings(csv_path), load_embeddings(npy_path)
    assert from_csv.dtype == from_npy.dtype == torch.float64
    assert torch.equal(from_csv, from_npy)


def test_huge_finite_csv_embeddings_stay_finite(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("1e308,1\n3.6e38,2\n")
    assert load_embeddings(path).tolist() == [[1e308, 1.0], [3.6e38, 2.0]]


_TORCH_FLOATS = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16]


@pytest.mark.parametrize("dtype", _TORCH_FLOATS)
def test_pt_floats_numpy_lacks_become_float32(tmp_path: Path, dtype: torch.dtype) -> None:
    """Every value of a bfloat16/float8 tensor is exact in float32: the oracle is .float()."""
    tensor = torch.tensor([[0.5, -1.0], [2.0, 3.0], [0.25, 1.5]]).to(dtype)
    path = tmp_path / "e.pt"
    torch.save(tensor, path)
    expected = tensor.float().numpy()
    assert np.array_equal(load_array(path), expected)
    assert load_embeddings(path).tolist() == expected.tolist()
    labels = tmp_path / "l.pt"
    torch.save(torch.tensor([0.0, 1.0, 2.0]).to(dtype), labels)
    assert read_labels(labels).tolist() == [0, 1, 2]


def test_pt_meta_is_refused_and_sparse_densified(tmp_path: Path) -> None:
    meta = tmp_path / "m.pt"
    torch.save(torch.empty(3, 2, device="meta"), meta)
    with pytest.raises(InputFileError, match=re.escape(f"'{meta}' holds a meta tensor")):
        load_embeddings(meta)
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    sparse = tmp_path / "s.pt"
    torch.save(dense.to_sparse(), sparse)
    assert load_embeddings(sparse).tolist() == dense.tolist()


def _documented_header(rows: list[list[str]], role: str) -> bool:
    """docs/cli.md's rule, written plainly: is the first line a header?"""

    def number(cell: str) -> bool:
        return re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", cell) is not None

    if any(number(cell) for cell in rows[0]):
        return False
    if role != "labels":
        return True
    rest = [cell for row in rows[1:] for cell in row]
    usual = len(rows[0]) == 1 and rows[0][0] in {"label", "class", "target", "y", "name"}
    return (
        (bool(rest) and all(number(cell) for cell in rest))
        or usual
        or (len(rows) == 1 and len(rows[0]) > 1)
    )


@SETTINGS
@given(
    cells=st.lists(st.sampled_from(["cat", "dog", "NA", "1", "2", "label", "class"]), min_size=2)
)
def test_label_header_detection_follows_the_documented_rule(
    tmp_path: Path, cells: list[str]
) -> None:
    """A one-column labels file keeps its first line unless docs/cli.md calls it a header."""
    path = tmp_path / "l.csv"
    path.write_text("\n".join(cells) + "\n")
    rows = [[cell] for cell in cells]
    expected = cells[1:] if _documented_header(rows, "labels") else cells
    assert [str(label) for label in read_labels(path).tolist()] == expected


def test_column_of_a_file_without_header_or_with_two_such_columns(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("0.5,1\n2,3\n")
    with pytest.raises(InputFileError, match="has no header line.*no column 'label'"):
        read_labels(f"{plain}:label")
    twice = tmp_path / "twice.csv"
    twice.write_text("x,x\n1,2\n")
    with pytest.raises(InputFileError, match="2 columns named 'x'.*ambiguous"):
        load_array(f"{twice}:x")
