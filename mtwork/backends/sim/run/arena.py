"""Memory shared between mtwork and the emulator's worker process, and the guarded memory
of kernels run in this process.

Shared memory comes in segments: files of memory no other process can name
(`host.shared_memory_file`, so nothing is left behind when either process dies) that both
processes map (`Mapping`). mtwork's side hands out blocks of them (`shared.SharedHeap`);
the worker maps a segment when it is first sent one and keeps all of it inaccessible but
the ranges the dispatch it runs uses (`WorkerMemory`): a kernel that writes past its
buffers, or far beyond, faults at once (like Electric Fence) instead of landing in
memory another array of mtwork's uses, or in the worker's heap.

Each block has one page before its data (the worker never opens it), its data from a page
boundary, the rest of the data's last page and one page of slack after it, which the
worker zeroes for every dispatch of a buffer it makes: they stand for the room a GPU
buffer's allocation has past its end (Metal rounds buffers up to whole pages). A kernel
may read or write a little past a buffer, as MLX's rader_fft does on its last rows, and
on the GPU that goes unnoticed; the sanitizer reports it.

Kernels run in this process (``isolate=False``) get a like layout from `guarded`:
private memory for the buffers mtwork makes itself (fresh outputs, aligned copies of bound
memory), each ending at a page of slack before a guard page, so a write far past one of
them faults instead of landing in the Python heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ....host import PAGE_SIZE

__all__ = ["ALIGN", "PAGE", "Mapping", "Placement", "WorkerMemory", "guarded", "layout"]

PAGE = PAGE_SIZE  # 16 KiB on Apple Silicon: slack and guards are whole pages
ALIGN = 16  # what Metal guarantees a buffer's start, and what vector loads need


@dataclass(frozen=True)
class Placement:
    """Where one buffer's bytes sit in shared memory: the segment, its span [start,
    start + nbytes) there, the offset of element 0 within it, its shape, byte strides and
    numpy dtype."""

    segment: int
    start: int
    nbytes: int
    data: int  # offset of element 0 from `start` (a reversed view starts at its end)
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    def view(self, buffer: Any) -> np.ndarray:
        return np.ndarray(self.shape, np.dtype(self.dtype), buffer=buffer,
                          offset=self.start + self.data, strides=self.strides)


@lru_cache(maxsize=1024)
def layout(spans: tuple[int, ...], page: int = PAGE
           ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Starts for buffers of `spans` bytes, the offsets of the guard pages between them,
    and the size of the whole, for pages of `page` bytes (the system's). Each buffer ends
    (rounded up to `ALIGN`) at a page of slack, the page before a guard page."""
    starts, guards, cursor = [], [0], page
    for n in spans:
        padded = -(-max(n, 1) // ALIGN) * ALIGN
        pages = -(-padded // page)
        starts.append(cursor + pages * page - padded)
        cursor += (pages + 1) * page  # the buffer's pages, then its slack
        guards.append(cursor)
        cursor += page
    return tuple(starts), tuple(guards), cursor


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10  # the same on Linux and macOS; Python's mmap module does not name it
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE


def _reguard(base: int, old: tuple[int, ...], new: tuple[int, ...]) -> None:
    """Guard pages at `new` (offsets from `base`) instead of `old`, and the slack page
    before each but the first zeroed. Pages that stay guard pages are left as they are: a
    repeated call's layout costs no system call. A failed mprotect (the process's limit
    on mappings reached) leaves the page ordinary memory: the dispatch runs unguarded, as
    on numpy's own memory."""
    if new != old:
        kept = set(new)
        for offset in old:
            if offset not in kept:
                _libc.mprotect(base + offset, PAGE, _PROT_RW)
    for offset in new[1:]:
        ctypes.memset(base + offset - PAGE, 0, PAGE)
    if new == old:
        return
    was = set(old)
    for offset in new:
        if offset not in was:
            _libc.mprotect(base + offset, PAGE, _PROT_NONE)


def _protect(address: int, length: int, writable: bool) -> None:
    mode = _PROT_RW if writable else _PROT_NONE
    if length and _libc.mprotect(address, length, mode) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of shared memory failed")


class Mapping:
    """One side's mapping of a shared file, whole; `writable=False` maps it inaccessible
    (ranges are opened with `protect`). Mapped by the system's call, not as a Python
    object: it stays until `close`, even while the interpreter ends (arrays of MLX's may
    use it then)."""

    def __init__(self, fd: int, *, writable: bool = True) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        address = _libc.mmap(None, self.size, _PROT_RW if writable else _PROT_NONE,
                             mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mapping shared memory failed")
        self.address: int = address
        self._bytes = (ctypes.c_uint8 * self.size).from_address(address)

    def protect(self, offset: int, length: int, writable: bool) -> None:
        _protect(self.address + offset, length, writable)

    def view(self, placement: Placement) -> np.ndarray:
        return placement.view(self._bytes)

    def privatize(self, kept: list[tuple[int, int]]) -> None:
        """Turns the mapping into private memory at the same address, the `kept` ranges
        (offset, length) copied over, the rest zero; the shared file is let go."""
        saved = [(offset, bytes(self._bytes[offset:offset + length]))
                 for offset, length in kept]
        address = _libc.mmap(self.address, self.size, _PROT_RW,
                             mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
        if address != self.address:
            raise OSError(ctypes.get_errno(), "making shared memory private failed")
        for offset, data in saved:
            ctypes.memmove(self.address + offset, data, len(data))
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        """Unmaps (no view of it may be used after) and closes the file."""
        _libc.munmap(self.address, self.size)
        if self.fd >= 0:
            os.close(self.fd)


# A range of a segment: (segment, offset, length).
Range = tuple[int, int, int]


def _overlap(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


class WorkerMemory:
    """The worker's mappings of the segments mtwork sent, by id: inaccessible but for the
    ranges of the dispatch that runs (`open`)."""

    def __init__(self) -> None:
        self.segments: dict[int, Mapping] = {}
        self._open: frozenset[Range] = frozenset()

    def attach(self, segment: int, fd: int) -> None:
        self.detach(segment)
        self.segments[segment] = Mapping(fd, writable=False)

    def detach(self, segment: int) -> None:
        mapping = self.segments.pop(segment, None)
        if mapping is not None:
            self._open = frozenset(r for r in self._open if r[0] != segment)
            mapping.close()

    def view(self, placement: Placement) -> np.ndarray:
        return self.segments[placement.segment].view(placement)

    def open(self, ranges: frozenset[Range], zeroed: tuple[Range, ...]) -> None:
        """Makes exactly `ranges` accessible (ranges already open stay so: a repeated
        plan costs no system call) and zeroes the `zeroed` ranges."""
        if ranges != self._open:
            was, closed = self._open, self._open - ranges
            self._open = frozenset()  # until every range below is as it should be
            for segment, offset, length in closed:
                self.segments[segment].protect(offset, length, False)
            for r in ranges:  # new ranges, and kept ones a closed range overlapped
                if r not in was or any(_overlap(r, c) for c in closed):
                    self.segments[r[0]].protect(r[1], r[2], True)
            self._open = ranges
        for segment, offset, length in zeroed:
            ctypes.memset(self.segments[segment].address + offset, 0, length)

    def close(self) -> None:
        for segment in list(self.segments):
            self.detach(segment)


class Block:
    """Private memory of this process, laid out for one dispatch at a time as `layout`
    says, guard pages made inaccessible on request; reused once nothing uses it."""

    def __init__(self, size: int) -> None:
        self.size = size
        try:
            mapping = mmap.mmap(-1, size)
        except OSError as error:  # as numpy says of an array it cannot allocate
            raise MemoryError(f"Unable to allocate {size:,} bytes for a dispatch's buffers "
                              f"({error.strerror})") from None
        self._bytes = np.frombuffer(mapping, dtype=np.uint8)
        self._guarded: tuple[int, ...] = ()

    def free(self) -> bool:
        # Every array made from this memory refers to `_bytes` (a numpy view keeps its
        # base): when only this block (and getrefcount's argument) does, none is left.
        return sys.getrefcount(self._bytes) == 2

    def lay_out(self, spans: tuple[int, ...], guard: bool) -> list[np.ndarray]:
        """The bytes of buffers of `spans` bytes, each ending at a zeroed page of slack
        before a guard page (inaccessible when `guard`)."""
        starts, guards, _ = layout(spans)
        wanted = guards if guard else ()
        _reguard(self._bytes.ctypes.data, self._guarded, wanted)
        if not guard:  # the slack pages, zeroed as a guarded layout's are
            for offset in guards[1:]:
                ctypes.memset(self._bytes.ctypes.data + offset - PAGE, 0, PAGE)
        self._guarded = wanted
        return [self._bytes[start : start + n] for start, n in zip(starts, spans)]


_BLOCKS: list[Block] = []  # kept for reuse, at most _BLOCKS_KEPT
_BLOCKS_KEPT = 4
_BLOCK_KEPT_BYTES = 256 << 20  # larger blocks are unmapped when their dispatch is done
_BLOCK_MIN_BYTES = 1 << 20
_blocks_lock = threading.Lock()


def guarded(spans: tuple[int, ...], *, guard: bool) -> list[np.ndarray]:
    """Memory of this process for buffers of `spans` bytes, each ending at a page of slack
    before a guard page, inaccessible when `guard`.
    From a kept block that no array uses any more (which spares a call the page faults of
    new memory), or a new one."""
    need = layout(spans)[2]
    with _blocks_lock:  # a block is taken when its first array exists
        block = next((b for b in _BLOCKS if b.size >= need and b.free()), None)
        if block is None:
            block = Block(max(need, _BLOCK_MIN_BYTES))
            if block.size <= _BLOCK_KEPT_BYTES:
                _BLOCKS[:] = [b for b in _BLOCKS if not b.free()]
                del _BLOCKS[:max(0, len(_BLOCKS) - _BLOCKS_KEPT + 1)]
                _BLOCKS.append(block)
        return block.lay_out(spans, guard)
