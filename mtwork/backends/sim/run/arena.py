"""Memory shared between mtwork and the emulator's worker process.

One anonymous file, mapped by both processes: mtwork copies a dispatch's inputs into it
and reads the written buffers back; the worker runs the kernel on it in place. No file
name outlives its making (`host.shared_memory_file`), so nothing is left behind when either
process dies.

Each buffer is placed so that it *ends* at a page boundary, followed by one page of
slack and then a guard page (and one guard page before its page run): in the worker the
guard pages are made inaccessible, so a write far past the end of a buffer traps (like
Electric Fence), instead of landing in another buffer or in the worker's heap. The slack,
zeroed for every dispatch, stands for the room a GPU buffer's allocation has past its end
(Metal rounds buffers up to whole pages): a kernel may read or write a little past a
buffer, as MLX's rader_fft does on its last rows, and on the GPU that goes unnoticed; the
sanitizer reports it.

Kernels run in this process (``isolate=False``) get the same layout from `guarded`:
private memory for the buffers mtwork makes itself (fresh outputs, aligned copies of bound
memory), guarded alike, so a write far past one of them faults instead of landing in the
Python heap.
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

import numpy as np

from ....host import PAGE_SIZE, shared_memory_file

__all__ = ["Arena", "Placement", "guarded", "layout"]

PAGE = PAGE_SIZE  # 16 KiB on Apple Silicon: slack and guards are whole pages
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


@lru_cache(maxsize=1024)
def layout(spans: tuple[int, ...], page: int = PAGE
           ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Starts for buffers of `spans` bytes, the offsets of the guard pages between them,
    and the arena size, for pages of `page` bytes (the system's). Each buffer ends
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
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE


def _reguard(base: int, old: tuple[int, ...], new: tuple[int, ...], *, strict: bool) -> None:
    """Guard pages at `new` (offsets from `base`) instead of `old`, and the slack page
    before each but the first zeroed. Pages that stay guard pages are left as they are: a
    repeated call's layout costs no system call. `strict`: a failed mprotect raises
    (else the page stays ordinary memory)."""
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
        if (offset not in was and _libc.mprotect(base + offset, PAGE, _PROT_NONE) != 0
                and strict):
            raise OSError(ctypes.get_errno(), "mprotect of a guard page failed")


class Arena:
    """One side's mapping of the shared file."""

    def __init__(self) -> None:
        self.fd = -1
        self.size = 0
        self.map: mmap.mmap | None = None
        self._base = 0
        self._guarded: tuple[int, ...] = ()

    def grow(self, size: int) -> bool:
        """Makes the arena at least `size` bytes (a new file); True when it is new."""
        if size <= self.size:
            return False
        self.attach(shared_memory_file(max(size, 2 * self.size, 1 << 20)))
        return True

    def attach(self, fd: int) -> None:
        """Maps the file `fd` (made by the other side), replacing any earlier one."""
        self.close()
        self.fd, self.size = fd, os.fstat(fd).st_size
        self.map = mmap.mmap(fd, self.size)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def address(self, offset: int) -> int:
        """The address of byte `offset` of this side's mapping."""
        return self._base + offset

    def guard(self, offsets: tuple[int, ...]) -> None:
        """Makes the pages at `offsets` inaccessible and zeroes the slack page before each
        but the first (the ones an earlier call guarded and these do not become ordinary
        memory again); they stay guarded until the next call of `guard`."""
        offsets = tuple(offsets)
        try:
            _reguard(self._base, self._guarded, offsets, strict=True)
        except OSError:
            _reguard(self._base, offsets, (), strict=False)
            self._guarded = ()
            raise
        self._guarded = offsets

    def close(self) -> None:
        if self.map is not None:
            self.guard(())
            self.map.close()
            os.close(self.fd)
        self.map, self.fd, self.size, self._base = None, -1, 0, 0


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
        # A failed mprotect (the process's limit on mappings reached) leaves the page
        # ordinary memory: the dispatch runs unguarded, as on numpy's own memory.
        wanted = guards if guard else ()
        _reguard(self._bytes.ctypes.data, self._guarded, wanted, strict=False)
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
    """Memory of this process for buffers of `spans` bytes laid out as the worker's arena
    is: each ends at a page of slack before a guard page, inaccessible when `guard`.
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
