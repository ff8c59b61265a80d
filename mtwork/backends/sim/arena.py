"""Memory shared between mtwork and the emulator's worker process.

One anonymous file, mapped by both processes: mtwork copies a dispatch's inputs into it
and reads the written buffers back; the worker runs the kernel on it in place. No file
name ever exists (memfd, or a temporary file unlinked at once), so nothing is left behind
when either process dies.

Each buffer is placed so that it *ends* at a page boundary, followed by one page of
slack and then a guard page (and one guard page before its page run): in the worker the
guard pages are made inaccessible, so a write far past the end of a buffer traps (like
Electric Fence), instead of landing in another buffer or in the worker's heap. The slack,
zeroed for every dispatch, stands for the room a GPU buffer's allocation has past its end
(Metal rounds buffers up to whole pages): a kernel may read or write a little past a
buffer, as MLX's rader_fft does on its last rows, and on the GPU that goes unnoticed; the
sanitizer reports it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import tempfile
from dataclasses import dataclass

import numpy as np

__all__ = ["Arena", "Placement", "layout"]

PAGE = mmap.PAGESIZE
ALIGN = 16  # what Metal guarantees a buffer's start, and what vector loads need


@dataclass(frozen=True)
class Placement:
    """Where one buffer's bytes sit in the arena: its span [start, start + nbytes), the
    offset of element 0 within it, its shape, byte strides and numpy dtype."""

    start: int
    nbytes: int
    data: int  # offset of element 0 from `start` (a reversed view starts at its end)
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    def view(self, buffer: memoryview | mmap.mmap) -> np.ndarray:
        return np.ndarray(self.shape, np.dtype(self.dtype), buffer=buffer,
                          offset=self.start + self.data, strides=self.strides)


def layout(spans: list[int]) -> tuple[list[int], list[int], int]:
    """Starts for buffers of `spans` bytes, the offsets of the guard pages between them,
    and the arena size. Each buffer ends (rounded up to `ALIGN`) at a page of slack, the
    page before a guard page."""
    starts, guards, cursor = [], [0], PAGE
    for n in spans:
        padded = -(-max(n, 1) // ALIGN) * ALIGN
        pages = -(-padded // PAGE)
        starts.append(cursor + pages * PAGE - padded)
        cursor += (pages + 1) * PAGE  # the buffer's pages, then its slack
        guards.append(cursor)
        cursor += PAGE
    return starts, guards, cursor


def _new_file(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("mtwork-arena", os.MFD_CLOEXEC)
    else:
        fd, path = tempfile.mkstemp(prefix="mtwork-arena-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE


class Arena:
    """One side's mapping of the shared file."""

    def __init__(self) -> None:
        self.fd = -1
        self.size = 0
        self.map: mmap.mmap | None = None
        self._base = 0
        self._guarded: list[int] = []

    def grow(self, size: int) -> bool:
        """Makes the arena at least `size` bytes (a new file); True when it is new."""
        if size <= self.size:
            return False
        self.attach(_new_file(max(size, 2 * self.size, 1 << 20)))
        return True

    def attach(self, fd: int) -> None:
        """Maps the file `fd` (made by the other side), replacing any earlier one."""
        self.close()
        self.fd, self.size = fd, os.fstat(fd).st_size
        self.map = mmap.mmap(fd, self.size)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def guard(self, offsets: list[int]) -> None:
        """Makes the pages at `offsets` inaccessible and zeroes the slack page before each
        but the first (the ones an earlier call guarded become ordinary memory again)."""
        for offset in self._guarded:
            _libc.mprotect(self._base + offset, PAGE, _PROT_RW)
        for offset in offsets[1:]:
            ctypes.memset(self._base + offset - PAGE, 0, PAGE)
        for offset in offsets:
            if _libc.mprotect(self._base + offset, PAGE, _PROT_NONE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect of a guard page failed")
        self._guarded = list(offsets)

    def close(self) -> None:
        if self.map is not None:
            self.guard([])
            self.map.close()
            os.close(self.fd)
        self.map, self.fd, self.size, self._base = None, -1, 0, 0
