"""Read embeddings, labels and scores from ``.npy``, ``.npz``, ``.pt`` and ``.csv`` files.

A file that holds several arrays (``.npz``, or a ``.pt`` dict) is read with ``FILE:KEY``;
without a key, the one array of the file is used, or else the array named after its role
(``embeddings``, ``labels`` or ``scores``), so ``pml-eval evaluate data.npz --labels
data.npz`` reads both from one file.

CSV files hold one row per sample, comma-separated, read as pandas would: UTF-8 with or
without a byte order mark, fields optionally in double quotes. Lines starting with ``#`` are
comments. A first line of names over lines of numbers is a header and is skipped, and so is
a usual column name (``label``, ``class``, ...) over a column of names; ``FILE.csv:COLUMN``
reads one column by its header name. Numbers are read exactly (see ``_csv_reader``).

A pipe (a FIFO, or ``<(...)`` process substitution) is read like a file, and ``-`` reads
standard input; their format is read off the suffix, or else off the bytes (``.npy``,
``.npz`` and ``.pt`` start with their own signatures, anything else is CSV). Other special
files (devices, sockets) are refused as "not a regular file".
"""

from __future__ import annotations

import functools
import io
import math
import os
import stat
import sys
import warnings
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from .._mapped import copy_by_blocks, register, row_blocks
from ..errors import InvalidArgumentError
from ._csv_reader import (
    EXACT_FLOAT,
    HEADER_NAMES,
    CsvError,
    FileRole,
    as_role,
    float_label_message,
    parse_csv,
)
from ._errors import UsageError

__all__ = [
    "SUFFIXES",
    "CATEGORIES",
    "FileRole",
    "InputFileError",
    "LABELS",
    "group_role",
    "check_one_stdin",
    "load_array",
    "load_embeddings",
    "load_labels",
    "read_label_like",
    "read_labels",
    "encode_labels",
    "load_match_labels",
    "load_scores",
]

SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".csv")
_KEYED_SUFFIXES = (".npz", ".pt", ".pth", ".csv")
STDIN = "-"
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_INT64_MAX = int(np.iinfo(np.int64).max)
_TRUE = {"true", "t", "yes", "y", "1", "1.0", "match", "same"}
_FALSE = {"false", "f", "no", "n", "0", "0.0", "non-match", "different"}


class InputFileError(InvalidArgumentError):
    """An input file is missing, unreadable, or does not hold what its role needs."""


LABELS = FileRole("labels", "labels", "label")
# The usual first lines of a one-column file of group ids (camera ids) or categories.
_GROUP_HEADERS = frozenset(
    {"group", "groups", "group_id", "group_ids", "groupid", "camera", "cameras", "cam", "cams"}
    | {"camid", "camids", "cam_id", "cam_ids", "camera_id", "camera_ids", "cameraid"}
)
_CATEGORY_HEADERS = frozenset(
    {"category", "categories", "category_id", "super_category", "supercategory"}
    | {"super_category_id", "superclass", "super_class", "super_class_id"}
)
CATEGORIES = FileRole(
    "labels",
    "categories",
    "category",
    "--query-categories",
    key="categories",
    header_names=HEADER_NAMES | _CATEGORY_HEADERS,
)


def group_role(option: str) -> FileRole:
    """The role of a group-id (camera-id) file named by ``option`` (``--query-groups``)."""
    return FileRole(
        "labels",
        "group ids",
        "group id",
        option,
        key="groups",
        header_names=HEADER_NAMES | _GROUP_HEADERS,
    )


def load_array(source: str | Path, role: str | FileRole = "embeddings") -> np.ndarray:
    """Read one array from ``source`` (``FILE`` or ``FILE:KEY``).

    Args:
        source: The file path, optionally followed by ``:KEY`` for ``.npz`` and ``.pt``.
        role: What the array is for (a name or a :class:`FileRole`); it names the
            default key and appears, with its option, in every error.

    Raises:
        InputFileError: for a missing or unreadable file, an unknown suffix or key.

    Example:
        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/x.npy"
        >>> np.save(path, np.eye(2))
        >>> load_array(path).shape
        (2, 2)
    """
    role = as_role(role)
    path, key = _split_key(str(source))
    handle, suffix = _open(path, role)
    if key is not None and suffix not in _KEYED_SUFFIXES:
        raise InputFileError(
            f"A ':KEY' can only follow a .npz, .pt or .csv file. Got '{source}' for the "
            f"{role.what}."
        )
    try:
        return _READERS[suffix](handle, path, key, role)
    except InputFileError:
        raise
    except CsvError as error:
        raise InputFileError(str(error)) from None
    except Exception as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise InputFileError(f"Cannot read the {role.what} file '{path}': {reason}") from error


def check_one_stdin(options: dict[str, Any]) -> None:
    """Refuse ``-`` (standard input) for more than one option: it can be read only once.

    Args:
        options: Each option's name (``QUERY``, ``--labels``...) and its value(s); a list
            value counts once per ``-`` in it.

    Raises:
        UsageError: naming the options that were given ``-`` (a command-line error).
    """
    named = [
        option
        for option, value in options.items()
        for item in (value if isinstance(value, (list, tuple)) else [value])
        if item is not None and str(item) == STDIN
    ]
    if len(named) > 1:
        raise UsageError(
            f"'{STDIN}' (standard input) can be given for one input only; it was given for "
            f"{' and '.join(named)}. Save all but one of them to files."
        )


def _open(path: Path, role: FileRole) -> tuple[Path | IO[bytes], str]:
    """``(what the reader reads, suffix)``: a regular file's path, or a pipe's bytes."""
    if str(path) == STDIN:
        return _sniffed(_stdin_bytes(), path, role)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputFileError(f"The {role.what} file '{path}' does not exist.") from None
    except OSError as error:
        raise InputFileError(
            f"Cannot read the {role.what} file '{path}': {error.strerror}"
        ) from None
    if stat.S_ISDIR(mode):
        raise InputFileError(f"The {role.what} file '{path}' is a folder; give the file in it.")
    if stat.S_ISFIFO(mode):
        with open(path, "rb") as pipe:
            return _sniffed(pipe.read(), path, role)
    if not stat.S_ISREG(mode):
        raise InputFileError(
            f"The {role.what} file '{path}' is not a regular file (a device or socket); give a "
            f"file, a pipe, or '{STDIN}' for standard input."
        )
    return path, _suffix(path, role)


@functools.lru_cache(maxsize=1)
def _stdin_bytes() -> bytes:
    """Standard input, read once: ``compare`` reads one ``--labels -`` for both models."""
    return sys.stdin.buffer.read()


def _suffix(path: Path, role: FileRole) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputFileError(
            f"The {role.what} file '{path}' must end with one of {', '.join(SUFFIXES)}. "
            f"Got '{suffix or path.name}' instead."
        )
    return suffix


def _sniffed(data: bytes, path: Path, role: FileRole) -> tuple[IO[bytes], str]:
    """A pipe's bytes and their format: the suffix if it has one, else the signature."""
    if path.suffix.lower() in SUFFIXES:
        return io.BytesIO(data), path.suffix.lower()
    if data.startswith(_NPY_MAGIC):
        return io.BytesIO(data), ".npy"
    if data.startswith(_ZIP_MAGIC):
        return io.BytesIO(data), ".pt" if b"data.pkl" in data else ".npz"
    if data.startswith(b"\x80"):  # a pickle: torch's legacy format
        return io.BytesIO(data), ".pt"
    return io.BytesIO(data), ".csv"


def load_embeddings(source: str | Path, *, keep_float16: bool = False) -> torch.Tensor:
    """Read a 2-D array of finite numbers as a tensor ``(rows, dims)``.

    float64 arrays stay float64, and so do a CSV's decimal numbers (each the float64
    nearest its text, as ``.npy`` would hold it); every other number type becomes float32.

    Args:
        source: ``FILE`` or ``FILE:KEY``.
        keep_float16: Return a float16 ``.npy`` file as the float16 tensor that views its
            memory mapping, never copied whole: the exact search converts each block to
            float32 as it searches it (float16 to float32 is exact). Otherwise the file is
            converted to float32 a block at a time, so its float16 values are never all
            resident next to their float32 copy.

    Example:
        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/e.csv"
        >>> _ = open(path, "w").write("0.5,1\\n2,3\\n")
        >>> load_embeddings(path).tolist()
        [[0.5, 1.0], [2.0, 3.0]]
    """
    array = load_array(source, "embeddings")
    name = str(source)
    if array.ndim != 2:
        raise InputFileError(
            f"The embeddings in '{name}' must be a 2-D array (rows, dims). "
            f"Got shape {tuple(array.shape)} instead."
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InputFileError(f"The embeddings in '{name}' are empty (shape {array.shape}).")
    mapped_half = isinstance(array, np.memmap) and array.dtype == np.float16
    values = array if mapped_half else _as_float(array, "embeddings", name)
    with warnings.catch_warnings():  # a mapped file is read-only, and nothing writes it
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        tensor = torch.from_numpy(values)
    if not all(bool(np.isfinite(block.numpy()).all()) for block in row_blocks(tensor)):
        raise InputFileError(f"The embeddings in '{name}' contain NaN or infinite values.")
    if mapped_half and not keep_float16:
        return copy_by_blocks(tensor, torch.float32)
    return tensor


def read_labels(
    source: str | Path, num_rows: int | None = None, role: FileRole = LABELS
) -> np.ndarray:
    """Read class labels as a 1-D array of integers or of strings (class names).

    A ``(rows, 1)`` array counts as a vector; integral floats become integers.

    Args:
        source: ``FILE`` or ``FILE:KEY``.
        num_rows: If given, the number of labels the embeddings need.
        role: What the values are (labels, or group ids and categories read alike), for
            the default key and the messages.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/labels.csv"
        >>> _ = open(path, "w").write("# label\\ncat\\ndog\\ncat\\n")
        >>> read_labels(path).tolist()
        ['cat', 'dog', 'cat']
    """
    name = str(source)
    array = _as_vector(load_array(source, role), role.what, name)
    _check_length(array, num_rows, role.what, name, _header_hint(array, num_rows, source, role))
    if array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        return array.astype(np.uint64)  # kept exact: int64 would make them negative
    if array.dtype.kind in "iub":
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        return _integral_floats(array, name, role)
    if array.dtype.kind not in "US":
        raise InputFileError(
            f"The {role.what} in '{name}' must be integers or names. Got values of type "
            f"{array.dtype} instead."
        )
    return array.astype(str)


def read_label_like(source: str | Path, num_rows: int, role: FileRole) -> np.ndarray:
    """Read a file of per-row ids that are not class labels (group ids, categories) as
    :func:`read_labels` reads labels: integers or names, never bools. Every error names
    ``role``'s values and option (e.g. ``group ids (--query-groups)``).

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/cams.csv"
        >>> _ = open(path, "w").write("camera\\nc1\\nc2\\n")
        >>> read_label_like(path, 2, group_role("--query-groups")).tolist()
        ['c1', 'c2']
    """
    array = load_array(source, role)
    if array.dtype.kind == "b":
        raise InputFileError(
            f"The {role.what} in '{source}' must be integers or names. "
            "Got values of type bool instead."
        )
    return read_labels(source, num_rows=num_rows, role=role)


def _header_hint(
    array: np.ndarray, num_rows: int | None, source: str | Path, role: FileRole
) -> str:
    """For names with one row too many in a CSV file: their first line may be a header
    the reader did not take for one; say how to read it as one."""
    if num_rows is None or len(array) != num_rows + 1 or array.dtype.kind not in "US":
        return ""
    if not str(source).lower().endswith(".csv"):
        return ""
    first = str(array[0])
    usual = ", ".join(sorted(role.header_names - HEADER_NAMES)[:4] or ["label", "class"])
    return (
        f" If its first line ('{first}') is a header, read the file as '{source}:{first}' "
        f"(a first line of a usual column name, e.g. {usual}, is taken as a header "
        "by itself)."
    )


def _integral_floats(array: np.ndarray, name: str, role: FileRole = LABELS) -> np.ndarray:
    """Float labels that are whole numbers, as int64; beyond 2^53 a float is not exact."""
    array = array.astype(np.float64)  # holds every narrower float exactly; 2^53 fits it
    exact = np.isfinite(array) & (array == np.round(array))
    exact &= np.abs(np.where(exact, array, 0)) <= EXACT_FLOAT
    if not exact.all():
        bad = array[~exact][0]
        raise InputFileError(float_label_message(name, repr(float(bad)), role))
    return array.astype(np.int64)


def encode_labels(*arrays: np.ndarray) -> tuple[list[torch.Tensor], list[Any] | None]:
    """Turn label arrays into ``torch.long`` tensors that share one numbering.

    Integer labels are kept as they are (and no names are returned). Otherwise every
    label is read as a name, and the names of all arrays together are numbered in sorted
    order, so a class has the same number in the query and in the reference. uint64
    labels of 2^63 and above are numbered the same way, named by their (integer) values.

    Returns:
        The tensors, in the order given, and the class names (index = number) or ``None``.

    Example:
        >>> (query, reference), names = encode_labels(np.array(["b"]), np.array(["a", "b"]))
        >>> query.tolist(), reference.tolist(), names
        ([1], [0, 1], ['a', 'b'])
    """
    integers = all(array.dtype.kind in "iu" for array in arrays)
    if integers and all(array.dtype.kind == "i" or _fits_int64(array) for array in arrays):
        return [torch.from_numpy(array.astype(np.int64)) for array in arrays], None
    # uint64 labels past int64 are numbered in order and named by their values
    text = [array.astype(object if integers else str) for array in arrays]
    names, numbered = np.unique(np.concatenate(text), return_inverse=True)
    bounds = np.cumsum([0] + [len(array) for array in text])
    tensors = [
        torch.from_numpy(numbered.reshape(-1)[start:stop].astype(np.int64))
        for start, stop in zip(bounds[:-1], bounds[1:])
    ]
    return tensors, [int(name) if integers else str(name) for name in names]


def _fits_int64(array: np.ndarray) -> bool:
    return len(array) == 0 or int(array.max()) <= _INT64_MAX


def load_labels(source: str | Path, num_rows: int | None = None) -> torch.Tensor:
    """Read class labels as a ``torch.long`` vector (names numbered in sorted order).

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/labels.csv"
        >>> _ = open(path, "w").write("# label\\ncat\\ndog\\ncat\\n")
        >>> load_labels(path).tolist()
        [0, 1, 0]
    """
    return encode_labels(read_labels(source, num_rows))[0][0]


def load_scores(source: str | Path) -> torch.Tensor:
    """Read a vector of finite scores (distances or similarities) as float64.

    Example:
        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/s.npy"
        >>> np.save(path, np.array([0.25, 0.5]))
        >>> load_scores(path).tolist()
        [0.25, 0.5]
    """
    name = str(source)
    array = _as_vector(load_array(source, "scores"), "scores", name)
    values = _as_float(array, "scores", name).astype(np.float64)
    if not np.isfinite(values).all():
        raise InputFileError(f"The scores in '{name}' contain NaN or infinite values.")
    return torch.from_numpy(values)


def load_match_labels(source: str | Path, num_rows: int) -> torch.Tensor:
    """Read one boolean per pair: 1/0, true/false, yes/no, match/non-match.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/same.csv"
        >>> _ = open(path, "w").write("true\\nfalse\\n1\\n")
        >>> load_match_labels(path, 3).tolist()
        [True, False, True]
    """
    name = str(source)
    array = _as_vector(load_array(source, "labels"), "labels", name)
    _check_length(array, num_rows, "labels", name)
    if array.dtype.kind == "b":
        return torch.from_numpy(array.copy())
    text = np.char.lower(np.char.strip(array.astype(str)))
    unknown = sorted(set(text.tolist()) - _TRUE - _FALSE)
    if unknown:
        raise InputFileError(
            f"The labels in '{name}' must say whether each pair matches (1/0 or true/false). "
            f"Got {unknown[:3]!r} instead."
        )
    return torch.from_numpy(np.isin(text, list(_TRUE)))


def _split_key(source: str) -> tuple[Path, str | None]:
    """``FILE:KEY`` -> ``(FILE, KEY)``, unless ``FILE:KEY`` is itself an existing file."""
    head, sep, tail = source.rpartition(":")
    if (
        sep
        and tail
        and Path(head).suffix.lower() in _KEYED_SUFFIXES
        and not os.path.lexists(source)
    ):
        return Path(head), tail
    return Path(source), None


Source = Path | IO[bytes]
# .npy embeddings searched in place (float16 converted a block at a time); any other type
# is converted, so it is read whole
_MAPPED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _read_npy(source: Source, path: Path, key: str | None, role: FileRole) -> np.ndarray:
    """A regular file is memory-mapped (read a block at a time later, never copied whole);
    a pipe's bytes are already in memory."""
    _check_npy_layout(source)
    if isinstance(source, Path) and role.kind == "embeddings":
        array = np.load(source, mmap_mode="r", allow_pickle=False)
        if isinstance(array, np.memmap) and array.dtype in _MAPPED_DTYPES and register(array):
            return array
        return np.asarray(array)
    return np.load(source, allow_pickle=False)


def _check_npy_layout(source: Source) -> None:
    """Refuse, with what was found, a file that is not a ``.npy`` array of numbers or whose
    data is shorter than its header says (a copy cut short): numpy's own messages for
    those speak of pickles and mmap lengths."""
    handle = source.open("rb") if isinstance(source, Path) else source
    if not handle.seekable():
        return  # a pipe: numpy reads it and reports a short read itself
    start = handle.tell()
    try:
        header = _npy_header(handle)
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
    finally:
        if isinstance(source, Path):
            handle.close()
        else:
            handle.seek(start)
    if header is None:
        return  # a format version numpy reads but this check does not know
    shape, dtype, data_offset = header
    found_bytes = end - data_offset
    if dtype.hasobject:
        raise ValueError(
            f"it holds Python objects (dtype {dtype}), not numbers: save a numeric array"
        )
    expected = math.prod(shape) * dtype.itemsize
    if found_bytes < expected:
        raise ValueError(
            f"the file is truncated: its header describes a {dtype} array of shape "
            f"{tuple(shape)} ({expected} bytes of data) but it holds {found_bytes} bytes of "
            f"data (an interrupted copy or write?)"
        )


def _npy_header(handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """``(shape, dtype, offset of the data)`` from a ``.npy`` header (None for a format
    version other than 1.0 and 2.0)."""
    try:
        version = np.lib.format.read_magic(handle)
    except ValueError:
        raise ValueError("it is not a .npy file (it does not start with numpy's header)") from None
    read = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }.get(version)
    if read is None:
        return None
    shape, _, dtype = read(handle)
    return shape, dtype, handle.tell()


def _read_npz(source: Source, path: Path, key: str | None, role: FileRole) -> np.ndarray:
    with np.load(source, allow_pickle=False) as archive:
        return _pick(dict(archive.items()), path, key, role)


def _read_pt(source: Source, path: Path, key: str | None, role: FileRole) -> np.ndarray:
    content = torch.load(source, map_location="cpu", weights_only=True)
    if isinstance(content, dict):
        content = _pick(content, path, key, role)
    elif key is not None:
        raise InputFileError(
            f"The {role.what} file '{path}' holds one tensor, not a dict; drop ':{key}'."
        )
    if isinstance(content, torch.Tensor):
        return _tensor_values(content, path, role)
    if isinstance(content, (list, tuple)):
        return np.asarray(content)
    raise InputFileError(
        f"The {role.what} file '{path}' must hold a tensor or a dict of tensors. "
        f"Got {type(content).__name__} instead."
    )


def _tensor_values(tensor: torch.Tensor, path: Path, role: FileRole) -> np.ndarray:
    """A saved tensor's values as NumPy holds them.

    A meta tensor has no values and is refused; a sparse one is made dense (its values are
    all there); floats NumPy has no type for (bfloat16, float8) become float32, which holds
    each of their values exactly.
    """
    if tensor.is_meta:
        raise InputFileError(
            f"The {role.what} file '{path}' holds a meta tensor (a shape with no values); save "
            "the tensor with its values."
        )
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_floating_point() and tensor.dtype not in _NUMPY_FLOATS:
        tensor = tensor.to(torch.float32)
    return tensor.detach().cpu().numpy()


_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def _pick(arrays: dict[str, Any], path: Path, key: str | None, role: FileRole) -> Any:
    """The array ``key`` names, else the only one, else the one named after the role."""
    if key is not None:
        if key not in arrays:
            raise InputFileError(
                f"The {role.what} file '{path}' has no array '{key}'. It has: "
                f"{sorted(map(str, arrays))}."
            )
        return arrays[key]
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    if role.default_key in arrays:
        return arrays[role.default_key]
    raise InputFileError(
        f"The {role.what} file '{path}' holds several arrays {sorted(map(str, arrays))} and "
        f"none is named '{role.default_key}'; choose one with '{path}:KEY'."
    )


def _read_csv(source: Source, path: Path, key: str | None, role: FileRole) -> np.ndarray:
    data = source.read_bytes() if isinstance(source, Path) else source.read()
    return parse_csv(data, str(path), role, column=key)


_READERS = {
    ".npy": _read_npy,
    ".npz": _read_npz,
    ".pt": _read_pt,
    ".pth": _read_pt,
    ".csv": _read_csv,
}


def _as_vector(array: np.ndarray, role: str, name: str) -> np.ndarray:
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise InputFileError(
            f"The {role} in '{name}' must be a 1-D array (one per row). "
            f"Got shape {tuple(array.shape)} instead."
        )
    if len(array) == 0:
        raise InputFileError(f"The {role} in '{name}' are empty.")
    return array


def _as_float(array: np.ndarray, role: str, name: str) -> np.ndarray:
    if array.dtype.kind not in "iuf":
        raise InputFileError(
            f"The {role} in '{name}' must be numbers. Got values of type {array.dtype} instead."
        )
    return array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False)


def _check_length(
    array: np.ndarray, num_rows: int | None, role: str, name: str, hint: str = ""
) -> None:
    if num_rows is not None and len(array) != num_rows:
        raise InputFileError(
            f"The {role} in '{name}' have {len(array)} rows but the data they label has "
            f"{num_rows}; they must have the same length.{hint}"
        )
