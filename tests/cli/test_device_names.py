"""--device is checked without torch: the spellings it accepts are the ones torch.device takes.

The oracle is ``torch.device`` itself, asked about generated strings; the parser under test
never imports torch.
"""

from __future__ import annotations

import argparse
import itertools
import string
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.cli.parsers._common import (
    MAX_DEVICE_INDEX,
    TORCH_DEVICE_TYPES,
    device_name,
    device_spelling_problem,
)


def _torch_accepts(text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'mkldnn' is deprecated, still accepted
        try:
            torch.device(text)
        except (RuntimeError, ValueError):
            return False
    return True


def _small_index(text: str) -> bool:
    """torch keeps the index in an int8 and wraps larger ones ('cuda:256' is cuda:0): the
    parser refuses those, so they are left out of the comparison."""
    index = text.partition(":")[2]
    return not index.isdigit() or int(index) <= MAX_DEVICE_INDEX


def _check_against_torch(text: str) -> None:
    ours = device_spelling_problem(text) == ""
    if ours:
        assert _torch_accepts(text), text
    elif _small_index(text):
        assert not _torch_accepts(text), text


_INDEX = st.one_of(
    st.integers(0, 300).map(str),
    st.text(string.digits, max_size=4),
    st.text(string.digits + string.ascii_letters + " -+:_.", max_size=4),
)
_TYPE = st.one_of(
    st.sampled_from(TORCH_DEVICE_TYPES),
    st.sampled_from(TORCH_DEVICE_TYPES).map(str.upper),
    st.text(string.ascii_letters + string.digits + "_ -", max_size=8),
)


@settings(max_examples=600, deadline=None)
@given(_TYPE, st.one_of(st.none(), _INDEX), st.sampled_from(["", " ", "\n"]))
def test_the_parser_accepts_what_torch_device_accepts(
    device_type: str, index: str | None, padding: str
) -> None:
    text = device_type if index is None else f"{device_type}:{index}"
    _check_against_torch(text)
    _check_against_torch(padding + text)
    _check_against_torch(text + padding)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12))
def test_any_text_as_a_device(text: str) -> None:
    _check_against_torch(text)


def test_every_short_lowercase_name_as_torch_sees_it() -> None:
    """All names of one to three letters: the short types (cpu, xpu, ve, ...) are all here."""
    for size in (1, 2, 3):
        for letters in itertools.product(string.ascii_lowercase, repeat=size):
            _check_against_torch("".join(letters))


@pytest.mark.parametrize("device_type", TORCH_DEVICE_TYPES)
def test_each_listed_type_and_its_indices(device_type: str) -> None:
    for index in ["", ":0", ":1", ":9", ":10", ":99", ":127", ":128", ":00", ":01", ":-1", ":"]:
        _check_against_torch(device_type + index)


@pytest.mark.parametrize(
    "text", ["bogus", "CPU", "cuda:x", "cuda:01", "cuda:128", "", " cpu", "gpu"]
)
def test_a_malformed_device_is_an_argument_error_that_lists_the_types(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        device_name(text)
    assert repr(text) in str(caught.value)


def test_an_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a device type.*cpu, cuda"):
        device_name("bogus")


def test_meta_is_refused_at_once() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="no values"):
        device_name("meta")
    assert device_name("cuda:3") == "cuda:3"  # availability is checked when the command runs
