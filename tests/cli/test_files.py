"""Files the command writes: atomic, never over an input, and announced; odd CSV inputs.

Faults are injected for real: ``os.replace``, ``os.fsync`` and the write itself fail with
ENOSPC/EIO/EACCES, and the previous output must survive byte for byte with no temporary
file left behind.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning import _atomic
from pytorch_metric_learning.errors import PMLError

from .conftest import error_line
from .test_loaders import write

PREVIOUS = b'{"metrics": {"precision_at_1": 0.5}}\n'


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 30)
    embeddings = (rng.normal(size=(30, 4)) + 3 * labels[:, None]).astype(np.float32)
    return {
        "q": write(tmp_path / "q.npy", embeddings),
        "l": write(tmp_path / "l.npy", labels),
        "out": tmp_path / "results.json",
    }


def _evaluate(cli, files: dict[str, Path], output: Path) -> object:
    return cli("evaluate", files["q"], "--labels", files["l"], "--output", output)


def _failing(code: int):
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize("target", ["replace", "fsync"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EACCES])
def test_a_failed_save_keeps_the_previous_file(
    cli, files, monkeypatch: pytest.MonkeyPatch, target: str, code: int
) -> None:
    files["out"].write_bytes(PREVIOUS)
    monkeypatch.setattr(os, target, _failing(code))
    result = _evaluate(cli, files, files["out"])
    monkeypatch.undo()
    assert result.code == 1
    line = error_line(result.err)
    assert f"'{files['out']}'" in line and os.strerror(code) in line
    assert files["out"].read_bytes() == PREVIOUS
    assert sorted(p.name for p in files["out"].parent.iterdir()) == [
        "l.npy",
        "q.npy",
        "results.json",
    ]


def test_a_write_that_stops_half_way_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    target.write_bytes(PREVIOUS)

    def half_then_full(handle) -> None:
        handle.write(b'{"truncated": ')
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left on device") as caught:
        _atomic.atomic_write(target, half_then_full)
    assert isinstance(caught.value, PMLError) and str(target) in str(caught.value)
    assert target.read_bytes() == PREVIOUS
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_successful_save_replaces_the_file_and_says_where(cli, files) -> None:
    files["out"].write_bytes(PREVIOUS)
    result = _evaluate(cli, files, files["out"])
    assert result.code == 0, result.err
    assert json.loads(files["out"].read_text())["settings"]["num_queries"] == 30
    assert f"Results written to {files['out']}" in result.out
    assert sorted(p.name for p in files["out"].parent.iterdir()) == [
        "l.npy",
        "q.npy",
        "results.json",
    ]


def test_the_saved_file_follows_the_umask(cli, files) -> None:
    previous = os.umask(0o027)
    try:
        assert _evaluate(cli, files, files["out"]).code == 0
    finally:
        os.umask(previous)
    assert files["out"].stat().st_mode & 0o777 == 0o640


def test_json_on_stdout_writes_no_file_and_no_message(cli, files, tmp_path: Path) -> None:
    result = _evaluate(cli, files, "-")
    assert result.code == 0
    assert json.loads(result.out)["settings"]["num_queries"] == 30
    assert "written to" not in result.out + result.err


@pytest.mark.parametrize("role", ["q", "l"])
def test_an_output_that_is_an_input_is_refused(cli, files, role: str) -> None:
    before = files[role].read_bytes()
    result = _evaluate(cli, files, files[role])
    assert result.code == 2
    assert "would replace it" in error_line(result.err)
    assert files[role].read_bytes() == before


def test_another_spelling_or_a_link_of_an_input_is_refused(cli, files, tmp_path: Path) -> None:
    link = tmp_path / "link.npy"
    link.symlink_to(files["q"])
    before = files["q"].read_bytes()
    for output in (link, tmp_path / "sub" / ".." / "q.npy"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        result = _evaluate(cli, files, output)
        assert result.code == 2, output
        assert files["q"].read_bytes() == before


def test_an_npz_input_with_a_key_is_still_the_same_file(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, embeddings=rng.normal(size=(20, 3)), labels=rng.integers(0, 2, 20))
    before = data.read_bytes()
    result = cli("evaluate", f"{data}:embeddings", "--labels", f"{data}:labels", "--output", data)
    assert result.code == 2
    assert data.read_bytes() == before


def test_threshold_refuses_plot_over_output_and_over_inputs(cli, tmp_path: Path) -> None:
    scores = write(tmp_path / "s.npy", np.linspace(0, 1, 20))
    labels = write(tmp_path / "l.npy", np.arange(20) < 10)
    same = tmp_path / "both.json"
    result = cli("threshold", scores, "--labels", labels, "--output", same, "--plot", same)
    assert result.code == 2 and not same.exists()
    result = cli("threshold", scores, "--labels", labels, "--plot", labels)
    assert result.code == 2
    assert np.load(labels).tolist() == (np.arange(20) < 10).tolist()


def test_threshold_output_says_where(cli, tmp_path: Path) -> None:
    scores = write(tmp_path / "s.npy", np.linspace(0, 1, 20))
    labels = write(tmp_path / "l.npy", np.arange(20) < 10)
    out = tmp_path / "t.json"
    result = cli("threshold", scores, "--labels", labels, "--output", out)
    assert result.code == 0 and f"Results written to {out}" in result.out
    assert json.loads(out.read_text())["num_pairs"] == 20


def test_backends_output_says_where(cli, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    result = cli("backends", "--output", out)
    assert result.code == 0 and f"Results written to {out}" in result.out
    assert "knn" in json.loads(out.read_text())


# CSV files as spreadsheet tools and pandas write them.


def _csv(path: Path, rows: list[str], encoding: str = "utf-8") -> Path:
    path.write_text("\n".join(rows) + "\n", encoding=encoding)
    return path


def test_a_bom_csv_of_200_rows_scores_all_200(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, 200)
    embeddings = rng.normal(size=(200, 3)) + 4 * labels[:, None]
    emb = _csv(tmp_path / "emb.csv", [",".join(map(str, row)) for row in embeddings], "utf-8-sig")
    lab = _csv(tmp_path / "labels.csv", [str(v) for v in labels], "utf-8-sig")
    assert emb.read_bytes().startswith(b"\xef\xbb\xbf")
    result = cli("evaluate", emb, "--labels", lab, "--metrics", "precision_at_1", "--output", "-")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert record["settings"]["num_queries"] == 200
    # Oracle: leave-one-out nearest neighbour by brute force.
    distances = ((embeddings[:, None] - embeddings[None]) ** 2).sum(-1)
    np.fill_diagonal(distances, np.inf)
    expected = float(np.mean(labels[distances.argmin(1)] == labels))
    assert record["metrics"]["precision_at_1"] == pytest.approx(expected)


def test_a_bom_csv_with_a_header_skips_only_the_header(tmp_path: Path) -> None:
    from pytorch_metric_learning.cli.loaders import load_embeddings

    path = _csv(tmp_path / "e.csv", ["x,y", "1,2", "3,4"], "utf-8-sig")
    assert load_embeddings(path).tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_quoted_fields_are_read_as_pandas_reads_them(tmp_path: Path) -> None:
    from pytorch_metric_learning.cli.loaders import load_embeddings, read_labels

    emb = _csv(tmp_path / "e.csv", ['"a","b"', '"1.5","2"', '3,"4"'])
    assert load_embeddings(emb).tolist() == [[1.5, 2.0], [3.0, 4.0]]
    names = _csv(tmp_path / "n.csv", ["# name", '"Smith, J."', "plain", '"say ""hi"""'])
    assert read_labels(names).tolist() == ["Smith, J.", "plain", 'say "hi"']


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n", "\ufeff"])
def test_an_empty_csv_is_named(cli, tmp_path: Path, content: str) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text(content, encoding="utf-8")
    labels = write(tmp_path / "l.npy", np.arange(3))
    for argv in (("evaluate", empty, "--labels", labels), ("threshold", empty, "--labels", labels)):
        result = cli(*argv)
        assert result.code == 1
        assert f"'{empty}' is empty" in error_line(result.err)


@pytest.mark.parametrize("command", ["evaluate", "threshold", "backends"])
def test_an_output_that_is_a_folder_is_refused(cli, tmp_path: Path, command: str) -> None:
    inputs = {
        "evaluate": [
            write(tmp_path / "q.npy", np.eye(4)),
            "--labels",
            write(tmp_path / "l.npy", np.arange(4) % 2),
        ],
        "threshold": [
            write(tmp_path / "s.npy", np.linspace(0, 1, 4)),
            "--labels",
            write(tmp_path / "m.npy", np.arange(4) < 2),
        ],
        "backends": [],
    }[command]
    (tmp_path / "folder").mkdir()
    result = cli(command, *inputs, "--output", tmp_path / "folder")
    assert result.code == 2
    assert "is a folder" in error_line(result.err)
    assert list((tmp_path / "folder").iterdir()) == []


def test_the_demo_refuses_a_file_as_its_folder(cli, tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    result = cli("demo", "--quick", "--output", target)
    assert result.code == 1
    assert "is a file" in error_line(result.err)
    assert target.read_text() == "keep me"


def test_leftovers_of_a_killed_write_are_removed_by_the_next_save(cli, files) -> None:
    folder = files["out"].parent
    leftover = folder / ".results.json.deadbeef.tmp"
    leftover.write_text('{"half": ')
    unrelated = folder / ".other.json.abc.tmp"
    unrelated.write_text("not ours to remove")
    assert _evaluate(cli, files, files["out"]).code == 0
    assert not leftover.exists()
    assert unrelated.read_text() == "not ours to remove"


def test_a_failed_plot_keeps_the_previous_plot(cli, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    scores = write(tmp_path / "s.npy", np.linspace(0, 1, 20))
    labels = write(tmp_path / "l.npy", np.arange(20) < 10)
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"\x89PNG previous plot")
    monkeypatch.setattr(os, "replace", _failing(errno.ENOSPC))
    result = cli("threshold", scores, "--labels", labels, "--plot", plot)
    monkeypatch.undo()
    assert result.code == 1
    assert f"'{plot}'" in error_line(result.err)
    assert plot.read_bytes() == b"\x89PNG previous plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npy", "plot.png", "s.npy"]


def test_compare_refuses_an_output_that_is_an_input(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    labels = write(tmp_path / "l.npy", rng.integers(0, 3, 30))
    a = write(tmp_path / "a.npy", rng.normal(size=(30, 4)).astype(np.float32))
    b = write(tmp_path / "b.npy", rng.normal(size=(30, 4)).astype(np.float32))
    before = b.read_bytes()
    result = cli("compare", a, b, "--labels", labels, "--output", b)
    assert result.code == 2
    assert "B_QUERY" in error_line(result.err)
    assert b.read_bytes() == before


def test_compare_says_where_it_wrote(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    labels = write(tmp_path / "l.npy", rng.integers(0, 3, 30))
    a = write(tmp_path / "a.npy", rng.normal(size=(30, 4)).astype(np.float32))
    b = write(tmp_path / "b.npy", rng.normal(size=(30, 4)).astype(np.float32))
    out = tmp_path / "c.json"
    result = cli("compare", a, b, "--labels", labels, "--output", out, "--resamples", "50")
    assert result.code == 0, result.err
    assert f"Results written to {out}" in result.out
    assert json.loads(out.read_text())


@pytest.mark.parametrize(
    ("option", "value"), [("--device", "meta"), ("--knn", "{oops"), ("--device", "banana")]
)
def test_compare_usage_errors(cli, tmp_path: Path, option: str, value: str) -> None:
    labels = write(tmp_path / "l.npy", np.arange(6) % 2)
    a = write(tmp_path / "a.npy", np.eye(6, 3, dtype=np.float32))
    result = cli("compare", a, a, "--labels", labels, option, value)
    assert result.code == 2
    assert f"argument {option}" in error_line(result.err)


# ---------------------------------------------------------------- issue 30: special paths
def _null_device(tmp_path: Path) -> Path:
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return node


def test_output_to_a_device_is_written_in_place_never_replaced(cli, files, tmp_path) -> None:
    node = _null_device(tmp_path)
    before = os.lstat(node)
    result = _evaluate(cli, files, node)
    assert result.code == 0, result.err
    after = os.lstat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_output_to_a_fifo_reaches_its_reader(cli, files, tmp_path: Path) -> None:
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = _evaluate(cli, files, fifo)  # the JSON fits the pipe's buffer
        assert result.code == 0, result.err
        data = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert json.loads(data)["settings"]["num_queries"] == 30
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_nobody_reads_is_refused_at_once(cli, files, tmp_path: Path) -> None:
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    result = _evaluate(cli, files, fifo)
    assert result.code == 1 and "no process reads" in result.err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_replaced_output_keeps_its_mode(cli, files) -> None:
    files["out"].write_bytes(PREVIOUS)
    os.chmod(files["out"], 0o600)
    assert _evaluate(cli, files, files["out"]).code == 0
    assert stat.S_IMODE(files["out"].stat().st_mode) == 0o600
    assert json.loads(files["out"].read_text())["settings"]["num_queries"] == 30


def test_an_output_link_is_replaced_not_written_through(cli, files, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "precious.txt"
    outside.parent.mkdir()
    outside.write_bytes(b"precious\n")
    link = tmp_path / "out" / "results.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    assert _evaluate(cli, files, link).code == 0
    assert outside.read_bytes() == b"precious\n"
    assert not link.is_symlink() and json.loads(link.read_text())["settings"]


@pytest.mark.parametrize("option", ["--output", "--plot"])
def test_an_empty_output_path_is_refused(cli, tmp_path: Path, option: str) -> None:
    scores = write(tmp_path / "s.npy", np.linspace(0, 1, 20))
    labels = write(tmp_path / "l.npy", np.arange(20) < 10)
    result = cli("threshold", scores, "--labels", labels, option, "")
    assert result.code == 2
    assert "empty path" in error_line(result.err) and option in error_line(result.err)
