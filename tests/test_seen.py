"""Notices remembered across runs: atomic, bounded, and never an error when the disk says no."""

from __future__ import annotations

import errno
import json
import os

import pytest

from pytorch_metric_learning import _seen


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("PML_CACHE_DIR", str(folder))
    return folder


def test_a_key_is_new_once_and_survives_a_new_process_read(cache) -> None:
    assert _seen.first_time("a") is True
    assert _seen.first_time("a") is False
    assert _seen.first_time("b") is True
    assert json.loads((cache / "seen_notices.json").read_text()) == ["a", "b"]


@pytest.mark.parametrize("failing", ["replace", "write"])
def test_a_failed_save_is_not_an_error_and_leaves_no_temp_file(cache, monkeypatch, failing):
    assert _seen.first_time("old") is True
    before = (cache / "seen_notices.json").read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_seen.os, failing, no_space)
    assert _seen.first_time("new") is True  # shown, just not remembered
    assert (cache / "seen_notices.json").read_bytes() == before  # the old file, whole
    assert sorted(os.listdir(cache)) == ["seen_notices.json"]


def test_the_file_keeps_only_the_newest_keys(cache, monkeypatch) -> None:
    monkeypatch.setattr(_seen, "_MAX_KEYS", 3)
    for key in "abcd":
        _seen.first_time(key)
    assert json.loads((cache / "seen_notices.json").read_text()) == ["b", "c", "d"]


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("PML_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if _seen.sys.platform not in ("win32", "darwin"):
        assert _seen.cache_dir() == tmp_path / "pytorch_metric_learning"
