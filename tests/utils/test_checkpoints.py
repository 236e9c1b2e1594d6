"""Checkpoint files: atomic writes, safe names, weights-only loading, DataParallel prefixes."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from pytorch_metric_learning.errors import CorruptFileError, InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.utils.checkpoints import (
    checkpoint_path,
    delete_checkpoints,
    load_checkpoints,
    load_state_dict,
    save_checkpoints,
    save_state_dict,
    saved_epochs,
    saved_suffixes,
    strip_module_prefix,
    unwrap_model,
)


class Payload:
    """An arbitrary object: a weights-only load must refuse to rebuild it."""

    def __reduce__(self):  # pragma: no cover - must never run
        return (os.system, ("echo pwned",))


def test_round_trip(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3)}
    save_state_dict(state, tmp_path / "a" / "m_1.pth")
    loaded = load_state_dict(tmp_path / "a" / "m_1.pth")
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize("broken", ["save", "replace"])
def test_failed_write_leaves_old_file_and_no_temp_file(tmp_path: Path, monkeypatch, broken) -> None:
    path = tmp_path / "trunk_best3.pth"
    save_state_dict({"w": torch.zeros(2)}, path)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch if broken == "save" else os, broken, boom)
    with pytest.raises(OSError, match="disk full"):
        save_state_dict({"w": torch.ones(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["trunk_best3.pth"]
    assert torch.equal(load_state_dict(path)["w"], torch.zeros(2))


def test_keyboard_interrupt_mid_write_cleans_up(tmp_path: Path, monkeypatch) -> None:
    def interrupted(obj, handle):
        handle.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_state_dict({"w": torch.ones(1)}, tmp_path / "m_1.pth")
    assert os.listdir(tmp_path) == []


def test_loading_is_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "evil_1.pth"
    with open(path, "wb") as handle:
        pickle.dump({"w": Payload()}, handle, protocol=2)
    with pytest.raises(CorruptFileError, match="evil_1.pth") as caught:
        load_state_dict(path)
    assert isinstance(caught.value.__cause__, pickle.UnpicklingError)


def test_file_that_is_not_a_state_dict(tmp_path: Path) -> None:
    torch.save(torch.ones(2), tmp_path / "m_1.pth")
    with pytest.raises(CorruptFileError, match="m_1.pth.*not a state dict"):
        load_state_dict(tmp_path / "m_1.pth")


@pytest.mark.parametrize(
    "name",
    ["../trunk", "a/b", "a\\b", "", ".hidden", "..", "x\x00y", "/abs", "trunk/../../x", "sp ace"],
)
def test_names_cannot_leave_the_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="'name' parameter"):
        checkpoint_path(tmp_path, name, 1)
    with pytest.raises(InvalidArgumentError):
        save_checkpoints({name: torch.nn.Linear(1, 1)}, tmp_path / "models", 1)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("suffix", ["../1", "best/1", "", "1.5"])
def test_suffixes_are_checked(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(InvalidArgumentError, match="'suffix' parameter"):
        checkpoint_path(tmp_path, "trunk", suffix)


def test_name_must_be_a_string(tmp_path: Path) -> None:
    with pytest.raises(InvalidTypeError):
        checkpoint_path(tmp_path, 3, 1)  # type: ignore[arg-type]


def test_plain_names_are_accepted(tmp_path: Path) -> None:
    for name in ["trunk", "trunk_optimizer", "model-v2", "resnet50.backbone"]:
        path = checkpoint_path(tmp_path, name, "best12")
        assert path.parent == tmp_path and path.name == f"{name}_best12.pth"


def test_strip_module_prefix() -> None:
    wrapped = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert list(wrapped.state_dict()) == ["module.0.weight", "module.0.bias"]
    assert list(strip_module_prefix(wrapped.state_dict())) == ["0.weight", "0.bias"]
    compiled_then_wrapped = {"module._orig_mod.w": 1}
    assert strip_module_prefix(compiled_then_wrapped) == {"w": 1}
    assert strip_module_prefix({}) == {}
    assert strip_module_prefix({"module.a": 1, "b": 2}) == {"module.a": 1, "b": 2}


def test_data_parallel_checkpoint_loads_into_plain_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = torch.nn.Linear(3, 2)
    wrapped = torch.nn.DataParallel(source)
    # A checkpoint written by someone else straight from the wrapped model.
    torch.save(wrapped.state_dict(), tmp_path / "trunk_1.pth")
    plain = torch.nn.Linear(3, 2)
    load_checkpoints({"trunk": plain}, tmp_path, 1)
    assert torch.equal(plain.weight, source.weight) and torch.equal(plain.bias, source.bias)
    # Saving a wrapped model writes plain names; loading into a wrapped model works too.
    save_checkpoints({"trunk": wrapped}, tmp_path, 2)
    assert list(torch.load(tmp_path / "trunk_2.pth", weights_only=True)) == ["weight", "bias"]
    other = torch.nn.DataParallel(torch.nn.Linear(3, 2))
    load_checkpoints({"trunk": other}, tmp_path, 2)
    assert torch.equal(other.module.weight, source.weight)
    assert unwrap_model(other) is other.module


def test_optimizer_state_round_trips(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    save_checkpoints({"opt": optimizer, "not_saveable": len}, tmp_path, 1)
    assert os.listdir(tmp_path) == ["opt_1.pth"]
    fresh = torch.optim.Adam(model.parameters(), lr=0.5)
    load_checkpoints({"opt": fresh}, tmp_path, 1)
    assert fresh.param_groups[0]["lr"] == 0.1
    assert torch.equal(
        fresh.state[model.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"]
    )


def test_saved_epochs_and_complete_sets(tmp_path: Path) -> None:
    objects = {"trunk": torch.nn.Linear(1, 1), "embedder": torch.nn.Linear(1, 1)}
    for suffix in [1, 2, "best2", 10]:
        save_checkpoints(objects, tmp_path, suffix)
    (tmp_path / "embedder_10.pth").unlink()
    (tmp_path / "trunk_optimizer_7.pth").write_bytes(b"")  # another name's file
    (tmp_path / "trunk_x3.pth").write_bytes(b"")
    assert saved_epochs(tmp_path, "trunk") == [1, 2, 10]
    assert saved_epochs(tmp_path, "trunk", tag="best") == [2]
    assert saved_suffixes(tmp_path, ["trunk", "embedder"]) == [1, 2]
    assert saved_suffixes(tmp_path, []) == []
    assert saved_epochs(tmp_path / "missing", "trunk") == []
    delete_checkpoints(["trunk", "embedder"], tmp_path, 1)
    delete_checkpoints(["trunk"], tmp_path, 99)  # already gone: fine
    assert saved_suffixes(tmp_path, ["trunk", "embedder"]) == [2]
