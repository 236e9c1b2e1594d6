"""Tensors over memory-mapped files: read them in row blocks and give the pages back.

``pml-eval`` memory-maps ``.npy`` inputs (``np.load(mmap_mode="r")``) so that a gallery
larger than memory is never copied whole. Every page a pass reads stays resident (and
counts in the process's RSS) until it is released, so the passes that read a whole
mapped tensor (the finite check, the fingerprint, the magnitude scan, the search) go
block by block and call :func:`release` after each block: ``madvise(MADV_DONTNEED)``
drops the block's pages from this process (the file keeps its bytes; a later read maps
them again). Only mappings :func:`register` was given are released; any other tensor is
read as it is, so in-memory tensors behave exactly as before.

The search of a mapped reference also frees a block's temporaries (its copy, its tile of
distances, its top-k) before the next block allocates the same again. glibc's malloc
keeps freed chunks of up to 32 MiB in its arenas instead of unmapping them (its mmap
threshold rises to the size of the largest chunk freed), and the blocks' temporaries,
spread over the arenas of several threads, left RSS growing by block: a 1,000,000-row
gallery peaked 90 to 210 MiB above the same search with a fixed threshold, varying run to
run. :func:`trim_heap` (``malloc_trim(0)``) hands that free memory back after each block.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
from collections.abc import Callable, Iterator

import numpy as np
import torch

__all__ = [
    "MAPPED_BLOCK_ROWS",
    "copy_by_blocks",
    "is_mapped",
    "register",
    "release",
    "row_blocks",
    "trim_heap",
]

# Rows per block of a pass over a mapped tensor: a few MiB resident at a time.
MAPPED_BLOCK_ROWS = 16_384

# (first address, end address, mapping) of each registered read-only mapping
_MAPPINGS: list[tuple[int, int, mmap.mmap]] = []


def register(array: np.ndarray) -> bool:
    """Remember the file mapping behind ``array`` (a ``np.memmap`` opened read-only).

    Returns:
        Whether ``array`` is backed by a mapping that can be released.
    """
    mapping = getattr(array, "_mmap", None)
    if not isinstance(mapping, mmap.mmap) or not hasattr(mapping, "madvise"):
        return False
    # np.memmap maps from the allocation boundary below the array's offset in the file
    skipped = getattr(array, "offset", 0) % mmap.ALLOCATIONGRANULARITY
    start = array.__array_interface__["data"][0] - skipped
    _MAPPINGS.append((start, start + len(mapping), mapping))
    return True


def _owner(tensor: torch.Tensor) -> tuple[int, mmap.mmap] | None:
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    address = tensor.data_ptr()
    for start, end, mapping in _MAPPINGS:
        if start <= address < end and not mapping.closed:
            return start, mapping
    return None


def is_mapped(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` views a registered file mapping."""
    return _owner(tensor) is not None


def release(block: torch.Tensor) -> None:
    """Drop the pages of a contiguous ``block`` of a registered mapping from this process."""
    owner = _owner(block)
    if owner is None:
        return
    start, mapping = owner
    first = block.data_ptr() - start
    last = first + block.numel() * block.element_size()
    first -= first % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_DONTNEED, first, min(last, len(mapping)) - first)


def row_blocks(tensor: torch.Tensor, rows: int = MAPPED_BLOCK_ROWS) -> Iterator[torch.Tensor]:
    """``tensor`` in blocks of ``rows`` rows; a mapped block's pages are released after use.

    An in-memory tensor is yielded whole (one block), as the passes read it before.
    """
    if not is_mapped(tensor) or tensor.ndim == 0:
        yield tensor
        return
    for start in range(0, len(tensor), rows):
        block = tensor[start : start + rows]
        yield block
        if block.is_contiguous():
            release(block)


def copy_by_blocks(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of ``tensor`` as ``dtype``, filled a block at a time: a mapped tensor's pages
    are given back after each block, so they are never all resident next to the copy."""
    copy = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
    start = 0
    for block in row_blocks(tensor):
        copy[start : start + len(block)] = block
        start += len(block)
    return copy


def trim_heap() -> None:
    """Give the free memory of the C heap back to the system (glibc's ``malloc_trim``);
    nothing where the C library has no such call (macOS, musl)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
