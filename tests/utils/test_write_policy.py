"""Issue 30, part 1: every writer of the library x every kind of existing path.

Each writer writes one target in a folder that also holds bystanders (a file the links
point to, inside and outside the folder). For every kind of path already at the target,
the test checks, against a plain snapshot taken before (an independent oracle: ``lstat``,
the bytes, the link text of every path under the root):

* nothing but the target changed (a link is never written through; a FIFO, a device or a
  folder is never replaced);
* the target holds the old content or the new, never a mix (the new content is what the
  same writer writes into a fresh, missing path);
* an existing regular file keeps its mode;
* no temporary file is left.

Writers that write the command line's outputs (``--output``, ``--plot``) write a FIFO or a
device in place, as the shell's ``>`` does; every other writer refuses them with
``FileWriteError``.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning import _atomic
from pytorch_metric_learning.cli._output import write_json
from pytorch_metric_learning.errors import FileWriteError
from pytorch_metric_learning.utils import _model_files
from pytorch_metric_learning.utils._record_csv import rewrite_file
from pytorch_metric_learning.utils.checkpoints import save_state_dict
from pytorch_metric_learning.utils.inference_model import InferenceModel
from pytorch_metric_learning.utils.record_keeping import Record, RecordKeeper, SQLiteManager

OLD = b"old content, 31 bytes long....\n"
KINDS = [
    "missing",
    "regular",
    "regular_0600",
    "read_only",
    "link_inside",
    "link_outside",
    "dangling_link",
    "fifo",
    "device",
    "folder",
]
SPECIAL = {"fifo", "device"}


@dataclass(frozen=True)
class Writer:
    """A writer of the library: ``write(target)``, and whether it writes special files in
    place (the command line's outputs) instead of refusing them."""

    name: str
    write: Callable[[Path], object]
    in_place: bool = False


def _json(target: Path) -> None:
    write_json(target, {"metric": 0.5, "nan": float("nan")})


def _plot(target: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from pytorch_metric_learning import plots

    figure = plots._new_figure(1.0, 1.0)
    figure.text(0.5, 0.5, "x")
    figure.set_dpi(20)
    plots._save(figure, target)


def _checkpoint(target: Path) -> None:
    save_state_dict({"w": torch.arange(4.0)}, target)


def _model_file(target: Path) -> None:
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(2.0)
    _model_files.save_model(layer, str(target))


def _csv(target: Path) -> None:
    rewrite_file(target, ["epoch", "acc"], [(1, 0.5), (2, 0.25)])


def _text(target: Path) -> None:
    _atomic.atomic_write_text(target, "new text\n")


def _by_name(target: Path) -> None:
    _atomic.atomic_save_to_path(target, lambda name: Path(name).write_bytes(b"by name\n"))


def _gallery(target: Path) -> None:
    model = InferenceModel(torch.nn.Identity())
    model.train_knn(torch.eye(3))
    model.save_knn_func(target)


def _faiss_index(target: Path) -> None:
    pytest.importorskip("faiss")
    from pytorch_metric_learning_faiss import FaissKNN

    knn = FaissKNN(reset_before=False, reset_after=False)
    knn.train(torch.eye(4))
    knn.save(target)


WRITERS = [
    Writer("cli_json", _json, in_place=True),
    Writer("plot", _plot, in_place=True),
    Writer("checkpoint", _checkpoint),
    Writer("model_file", _model_file),
    Writer("csv_rebuild", _csv),
    Writer("atomic_text", _text),
    Writer("save_by_name", _by_name),
    Writer("inference_gallery", _gallery),
    Writer("faiss_index", _faiss_index),
]


# ------------------------------------------------------------------------ the oracle
def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root``: its type, and its bytes (regular files), link text
    (links) or mode (folders). Special files are not read."""
    found: dict[str, tuple] = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder) / name
            info = os.lstat(path)
            kind = stat.S_IFMT(info.st_mode)
            if stat.S_ISREG(info.st_mode):
                found[str(path)] = (kind, stat.S_IMODE(info.st_mode), path.read_bytes())
            elif stat.S_ISLNK(info.st_mode):
                found[str(path)] = (kind, os.readlink(path))
            else:
                found[str(path)] = (kind, info.st_rdev)
    return found


def make_kind(target: Path, kind: str, outside: Path) -> None:
    """Put a path of ``kind`` at ``target`` (links point to bystanders that must stay)."""
    inside = target.parent / "bystander.txt"
    inside.write_bytes(b"inside bystander\n")
    outside.write_bytes(b"outside bystander\n")
    if kind in ("regular", "regular_0600", "read_only"):
        target.write_bytes(OLD)
        os.chmod(target, {"regular": 0o644, "regular_0600": 0o600, "read_only": 0o444}[kind])
    elif kind == "link_inside":
        target.symlink_to(inside.name)
    elif kind == "link_outside":
        target.symlink_to(outside)
    elif kind == "dangling_link":
        target.symlink_to(target.parent / "nowhere")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        try:  # a private null device (1, 3), made under the temporary folder
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "folder":
        target.mkdir()
        (target / "inside_the_folder.txt").write_bytes(b"keep me\n")


def expected_new(writer: Writer, root: Path, name: str) -> bytes:
    """What ``writer`` writes into a missing path (the same writer, a fresh folder)."""
    fresh = root / "fresh"
    fresh.mkdir()
    writer.write(fresh / name)
    return (fresh / name).read_bytes()


class FifoReader:
    """Reads a FIFO to its end in a thread, so that a writer in place does not block."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(self.fd, True)
        self.data = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        chunks = []
        while True:
            chunk = os.read(self.fd, 65536)
            if chunk:
                chunks.append(chunk)
            elif chunks:  # the writer closed its end
                break
            else:  # no writer yet: a FIFO without one reads as empty
                time.sleep(0.001)
        self.data = b"".join(chunks)

    def finish(self) -> bytes:
        self.thread.join(timeout=60)
        os.close(self.fd)
        return self.data


# ------------------------------------------------------------------------ the property
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_every_writer_on_every_kind_of_path(tmp_path: Path, writer: Writer, kind: str) -> None:
    name = "target.out"
    new = expected_new(writer, tmp_path, name)
    root = tmp_path / "root"
    folder = root / "folder"
    folder.mkdir(parents=True)
    target = folder / name
    make_kind(target, kind, root / "outside.txt")
    before = snapshot(root)
    reader = FifoReader(target) if kind == "fifo" and writer.in_place else None

    error: FileWriteError | None = None
    try:
        writer.write(target)
    except FileWriteError as caught:
        error = caught

    if reader is not None:
        assert error is None
        assert reader.finish() == new  # the FIFO's reader got every byte
    after = snapshot(root)
    others = {p: v for p, v in after.items() if not p.startswith(str(target))}
    assert others == {p: v for p, v in before.items() if not p.startswith(str(target))}
    assert [p for p in after if p.endswith(".tmp")] == []

    if kind in SPECIAL or kind == "folder":
        if not (writer.in_place and kind in SPECIAL):
            assert error is not None and str(target) in str(error)
        # never replaced: the same FIFO, device or folder (with its contents) is there
        assert {p: v for p, v in after.items() if p.startswith(str(target))} == {
            p: v for p, v in before.items() if p.startswith(str(target))
        }
        return
    assert error is None
    assert not target.is_symlink()
    assert target.read_bytes() == new
    mode = stat.S_IMODE(os.stat(target).st_mode)
    if kind in ("regular", "regular_0600", "read_only"):
        assert mode == before[str(target)][1]  # the old file's mode is kept
    else:
        umask = os.umask(0)
        os.umask(umask)
        assert mode == 0o666 & ~umask  # a new file: as open() would create it


def _records_db(target: Path) -> None:
    manager = SQLiteManager(target)
    manager.write([Record("g", "acc", 1, 0.5, 0.0)], {"g": "epoch"})
    manager.close()


NOT_REGULAR = [
    kind for kind in KINDS if kind not in ("missing", "regular", "regular_0600", "read_only")
]


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", NOT_REGULAR)
def test_the_records_database_writer_on_every_kind_of_path(
    tmp_path: Path, kind: str, suffix: str
) -> None:
    """The SQLite writer: ``records.db`` and each of its side files that is not a regular
    file (a link anywhere, a FIFO, a device, a folder) is refused before SQLite opens
    anything; nothing under the root changes (no table added to a linked database, no
    ``-journal`` created beside a link's target)."""
    root = tmp_path / "root"
    folder = root / "folder"
    folder.mkdir(parents=True)
    target = folder / "records.db"
    side = folder / f"records.db{suffix}"
    outside = root / "outside.db"
    make_kind(side, kind, outside)
    if kind == "link_outside":  # a real database outside: it must not get our tables
        outside.unlink()
        sqlite3.connect(outside).execute("CREATE TABLE app (x)").connection.commit()
    before = snapshot(root)
    with pytest.raises(FileWriteError) as caught:
        _records_db(target)
    assert str(side) in str(caught.value)
    assert snapshot(root) == before


def test_the_records_database_writer_on_a_missing_path(tmp_path: Path) -> None:
    _records_db(tmp_path / "records.db")
    rows = sqlite3.connect(tmp_path / "records.db").execute("SELECT step, value FROM records")
    assert rows.fetchall() == [(1, 0.5)]


@settings(max_examples=30, deadline=None)
@given(mode=st.integers(0, 0o777), size=st.integers(0, 300_000))
def test_a_replaced_file_keeps_any_mode(tmp_path_factory, mode: int, size: int) -> None:
    folder = tmp_path_factory.mktemp("modes")
    target = folder / "results.json"
    target.write_bytes(OLD)
    os.chmod(target, mode)
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    _atomic.atomic_write(target, lambda handle: handle.write(data))
    assert target.read_bytes() == data
    assert stat.S_IMODE(os.stat(target).st_mode) == mode
    assert sorted(os.listdir(folder)) == ["results.json"]


# ------------------------------------------------------------------------ temp names
def test_an_existing_temp_name_is_never_removed_or_reused(tmp_path: Path, monkeypatch) -> None:
    """A planted ``.<name>.<hex>.tmp`` that this call did not create survives a failed
    write, and a name that exists is never opened: another is drawn."""
    target = tmp_path / "out.json"
    planted = tmp_path / ".out.json.0000abcd.tmp"
    planted.write_bytes(b"not yours")
    names = iter(["0000abcd", "0000abcd", "1111ef01"])
    monkeypatch.setattr(_atomic.secrets, "token_hex", lambda n: next(names))

    def failing(handle) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(FileWriteError, match="out.json"):
        _atomic.atomic_write(target, failing)
    assert planted.read_bytes() == b"not yours"
    assert sorted(os.listdir(tmp_path)) == [planted.name]


def test_the_clean_up_never_removes_a_live_writers_temp_file(tmp_path: Path) -> None:
    """A temporary file that a writer still holds (locked) is not a leftover; one whose
    writer died (unlocked) is."""
    target = tmp_path / "trunk_1.pth"
    seen: list[list[str]] = []

    def write(handle) -> None:
        handle.write(b"partial")
        # while this write is live, another save of the same name cleans up leftovers
        dead = tmp_path / ".trunk_1.pth.deadbeef.tmp"
        dead.write_bytes(b"left by a killed save")
        _atomic.remove_leftovers(tmp_path, _atomic.re.compile(r"trunk_1\.pth"))
        seen.append(sorted(os.listdir(tmp_path)))
        handle.write(b" and the rest")

    _atomic.atomic_write(target, write)
    [names] = seen
    assert ".trunk_1.pth.deadbeef.tmp" not in names
    assert len([n for n in names if n.endswith(".tmp")]) == 1  # the live one, still there
    assert target.read_bytes() == b"partial and the rest"


def test_a_fifo_without_a_reader_is_refused_not_waited_for(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(FileWriteError, match="no process reads"):
        write_json(fifo, {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ------------------------------------------------------------------------ CSV appends
def _keeper_with_rows(folder: Path) -> tuple[RecordKeeper, Path]:
    keeper = RecordKeeper(folder)
    keeper.update_records({"acc": 0.5}, 1, "g", step_name="epoch")
    keeper.save_records()
    return keeper, keeper.csv_path("g", "acc")


def _csv_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["link_inside", "link_outside", "dangling_link"])
def test_an_append_never_follows_a_link(tmp_path: Path, kind: str) -> None:
    keeper, csv = _keeper_with_rows(tmp_path / "logs")
    outside = tmp_path / "authorized_keys"
    outside.write_bytes(b"ssh-ed25519 AAAA precious\n")
    inside = csv.parent / "other.csv"
    inside.write_bytes(b"epoch,other\n")
    csv.unlink()
    csv.symlink_to({"link_inside": inside, "link_outside": outside}.get(kind, tmp_path / "no"))
    keeper.update_records({"acc": 0.75}, 2, "g", step_name="epoch")
    keeper.save_records()
    keeper.close()
    assert outside.read_bytes() == b"ssh-ed25519 AAAA precious\n"
    assert inside.read_bytes() == b"epoch,other\n"
    assert not csv.is_symlink()
    assert _csv_of(csv) == "epoch,acc\n1,0.5\n2,0.75\n"  # rebuilt from SQLite


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: text[:-1], id="no-final-newline"),
        pytest.param(lambda text: text[:-3], id="cut-mid-line"),
        pytest.param(lambda text: text + "7,0.1\n", id="extra-row"),
        pytest.param(lambda text: "epoch,acc\n", id="rows-lost"),
        pytest.param(lambda text: "", id="empty"),
    ],
)
def test_a_csv_whose_tail_disagrees_with_sqlite_is_rebuilt(tmp_path: Path, damage) -> None:
    keeper, csv = _keeper_with_rows(tmp_path)
    keeper.update_records({"acc": 0.25}, 3, "g", step_name="epoch")
    keeper.save_records()
    csv.write_text(damage(_csv_of(csv)), encoding="utf-8")
    keeper.update_records({"acc": 0.125}, 24, "g", step_name="epoch")
    keeper.save_records()
    keeper.close()
    assert _csv_of(csv) == "epoch,acc\n1,0.5\n3,0.25\n24,0.125\n"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_csv_that_is_a_special_file_is_refused_and_kept(tmp_path: Path, kind: str) -> None:
    keeper, csv = _keeper_with_rows(tmp_path)
    csv.unlink()
    make_kind(csv, kind, tmp_path / "outside.txt")
    keeper.update_records({"acc": 0.75}, 2, "g", step_name="epoch")
    with pytest.raises(FileWriteError, match="acc.csv"):
        keeper.save_records()
    assert not stat.S_ISREG(os.lstat(csv).st_mode)
    assert keeper.sqlite_manager.rows("g", "acc") == [(1, 0.5), (2, 0.75)]  # in SQLite
    csv.unlink()
    keeper.close()  # the next save completes the file
    assert _csv_of(csv) == "epoch,acc\n1,0.5\n2,0.75\n"


def test_csv_file_names_never_collide(tmp_path: Path) -> None:
    """Names that the safe-name rule maps to one file (and names differing only in case,
    one file on a case-insensitive disk) get distinct files; each keeps its own rows."""
    from pytorch_metric_learning.utils.record_keeping import safe_file_name

    names = ["a b", "a_b-" + safe_file_name("a b").rsplit("-", 1)[1], "Acc", "acc", "a/b"]
    keeper = RecordKeeper(tmp_path)
    for i, name in enumerate(names):
        keeper.update_records({name: float(i)}, 1, "g", step_name="epoch")
    keeper.save_records()
    paths = [keeper.csv_path("g", name) for name in names]
    assert len({str(p).lower() for p in paths}) == len(names)
    for i, path in enumerate(paths):
        assert path.parent == tmp_path / "g"
        assert path.read_text(encoding="utf-8").splitlines()[1:] == [f"1,{float(i)!r}"]
    keeper.close()
    assert [RecordKeeper(tmp_path).csv_path("g", name) for name in names] == paths


# ------------------------------------------- folders below the run's folder, hard links
FOLDER_KINDS = ["link_inside", "link_outside", "dangling_link"]


def _link_folder(at: Path, kind: str, outside: Path) -> None:
    """Make ``at`` a symbolic link to a folder inside the root, outside it, or nowhere."""
    inside = at.parent / "real_inside"
    inside.mkdir(exist_ok=True)
    outside.mkdir(exist_ok=True)
    (outside / "keep.txt").write_bytes(b"outside\n")
    at.symlink_to({"link_inside": inside, "link_outside": outside}.get(kind, at.parent / "no"))


def _csv_append_through_group(tmp_path: Path, kind: str) -> tuple[Path, Path, Callable[[], None]]:
    keeper, csv = _keeper_with_rows(tmp_path / "root" / "logs")
    group = csv.parent
    for child in group.iterdir():
        child.unlink()
    group.rmdir()
    _link_folder(group, kind, tmp_path / "root" / "outside")

    def write() -> None:
        try:
            keeper.update_records({"acc": 0.75}, 2, "g", step_name="epoch")
            keeper.save_records()
        finally:
            keeper.close()

    return tmp_path / "root", group, write


def _set_aside_through_superseded(
    tmp_path: Path, kind: str
) -> tuple[Path, Path, Callable[[], None]]:
    from pytorch_metric_learning.utils.checkpoints import checkpoint_files, set_aside

    folder = tmp_path / "root" / "models"
    folder.mkdir(parents=True)
    save_state_dict({"w": torch.zeros(1)}, folder / "trunk_1.pth")
    _link_folder(folder / "superseded", kind, tmp_path / "root" / "outside")
    return (
        tmp_path / "root",
        folder / "superseded",
        lambda: set_aside(checkpoint_files(folder), folder),
    )


@pytest.mark.parametrize("kind", FOLDER_KINDS)
@pytest.mark.parametrize("setup", [_csv_append_through_group, _set_aside_through_superseded])
def test_no_writer_goes_through_a_linked_folder(tmp_path: Path, setup, kind: str) -> None:
    """A folder below the run's folder that is a symbolic link (a CSV group folder, the
    ``superseded`` folder of a model folder) is refused: nothing under the root changes."""
    root, linked, write = setup(tmp_path, kind)
    before = _without_own_files(snapshot(root))
    with pytest.raises(FileWriteError, match="symbolic link") as caught:
        write()
    assert str(linked) in str(caught.value)
    assert _without_own_files(snapshot(root)) == before


def _without_own_files(found: dict[str, tuple]) -> dict[str, tuple]:
    """The snapshot less the run's own database and lock files (they record the rows)."""
    return {p: v for p, v in found.items() if not Path(p).name.startswith(("records.db", "."))}


def test_a_hard_linked_csv_is_rebuilt_not_appended_to(tmp_path: Path) -> None:
    keeper, csv = _keeper_with_rows(tmp_path / "logs")
    outside = tmp_path / "outside.csv"
    os.link(csv, outside)
    before = outside.read_bytes()
    keeper.update_records({"acc": 0.75}, 2, "g", step_name="epoch")
    keeper.save_records()
    keeper.close()
    assert outside.read_bytes() == before  # the other name keeps its bytes
    assert os.stat(csv).st_nlink == 1
    assert _csv_of(csv) == "epoch,acc\n1,0.5\n2,0.75\n"


# ------------------------------------------------------- messages of in-place writes
def test_a_device_without_a_driver_is_named_as_what_it_is(tmp_path: Path) -> None:
    node = tmp_path / "blockdev"
    try:  # a block device whose major number no driver claims: opening it gives ENXIO
        os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(4095, 4095))
    except PermissionError:
        pytest.skip("making a device node needs root")
    with pytest.raises(FileWriteError) as caught:
        _atomic.atomic_write(node, lambda handle: handle.write(b"x"), in_place=True)
    assert "block device" in str(caught.value) and "FIFO" not in str(caught.value)
    assert stat.S_ISBLK(os.lstat(node).st_mode)


def test_a_broken_stream_does_not_claim_a_previous_version_is_intact() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away: the write gets EPIPE
    try:
        with pytest.raises(FileWriteError) as caught:
            _atomic.atomic_write(
                Path(f"/proc/self/fd/{write_end}"), lambda h: h.write(b"x" * 70000), in_place=True
            )
    finally:
        os.close(write_end)
    message = str(caught.value)
    assert "intact" not in message and "FIFO" in message and "part of it" in message
