"""mtwork's side of the memory it shares with the emulator's worker: blocks of shared
segments, handed out and taken back.

A kernel run in the worker reads and writes this memory in place. An output of MLX's
graph can be such a block (the MLX array's data, given back when MLX frees the array:
`mtwork.graph`), so the worker writes the output where MLX reads it, and a later kernel
given that array reads it where it is: a chain of kernels copies nothing. Inputs that
live elsewhere (MLX's or numpy's memory) are copied into a staging block for the call.

Blocks come in size classes (a whole number of pages, four classes per doubling, so a
block wastes less than a fifth of its size); a segment holds blocks of one class (up to
`SEGMENT_BYTES` of them; a larger block has a segment of its own). A freed block goes on
its class's free list, most recently freed first (a loop's calls get the same blocks back,
so the worker's plan and open ranges repeat); free blocks beyond the cache limit are given
back to the system a segment at a time, when none of a segment's blocks is in use.

Lifetime: a segment stays mapped in this process while any block of it is in use, so an
array stays valid whatever happens to the worker (a new worker maps the segments it is
sent again) and whenever the array is freed. A process forked from this one (its child)
must not share them: the child's copies of the blocks in use become private memory of
its own, and it starts a heap of its own (`os.register_at_fork`).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from dataclasses import dataclass, field

from ....gpu.device import machine_memory
from ....host import shared_memory_file
from .arena import PAGE, Mapping

__all__ = ["SEGMENT_BYTES", "SharedBlock", "SharedHeap", "heap"]

SEGMENT_BYTES = 16 << 20
_CACHE_MIN = 64 << 20  # free bytes always worth keeping
_CACHED_BLOCKS = 4  # blocks of the largest size asked for that the cache holds
_CACHE_SHARE = 8  # ... but at most this fraction of the machine's memory


def _class_pages(nbytes: int) -> int:
    """The data pages of the class that holds `nbytes`: n pages up to 4, then four
    classes per doubling (5, 6, 7, 8, 10, 12, 14, 16, 20...)."""
    pages = max(1, -(-nbytes // PAGE))
    if pages <= 4:
        return pages
    step = 1 << (pages.bit_length() - 3)
    return -(-pages // step) * step


@dataclass(eq=False)
class Segment:
    """One shared file of blocks of one class: `slots` blocks of `block_bytes` (a page
    before the data, the data pages, a page of slack), then a page no block uses."""

    id: int
    mapping: Mapping
    data_pages: int
    slots: int
    handed: int = 0  # slots [0, handed) have been handed out (the others never touched)
    used: dict[int, SharedBlock] = field(default_factory=dict)

    @property
    def block_bytes(self) -> int:
        return (self.data_pages + 2) * PAGE

    def data_offset(self, slot: int) -> int:
        return slot * self.block_bytes + PAGE


@dataclass(eq=False)
class SharedBlock:
    """One block in use: `capacity` bytes of data at `address` (page-aligned) in this
    process, at `offset` of its segment; `nbytes` asked for."""

    heap: SharedHeap
    segment: Segment
    slot: int
    nbytes: int

    @property
    def offset(self) -> int:
        return self.segment.data_offset(self.slot)

    @property
    def address(self) -> int:
        return self.segment.mapping.address + self.offset

    @property
    def capacity(self) -> int:
        return self.segment.data_pages * PAGE

    def release(self) -> None:
        """Gives the block back (once; a second call does nothing)."""
        self.heap.release(self)


class SharedHeap:
    """The blocks of shared memory this process hands out (see the module). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._segments: dict[int, Segment] = {}
        self._bases: list[tuple[int, int]] = []  # (address, segment id), sorted
        self._free: dict[int, list[tuple[Segment, int]]] = {}  # class -> freed blocks
        self.in_use = 0  # bytes of blocks in use (capacity)
        self.peak = 0
        self.cached = 0  # bytes of freed blocks kept
        self.cache_limit = _CACHE_MIN
        self.cache_limit_set = False  # the caller chose the limit
        self._cache_most = machine_memory() // _CACHE_SHARE
        self.forgotten: list[int] = []  # segments unmapped since the worker last heard

    # --- blocks ------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> SharedBlock:
        """A block of at least `nbytes` (one page for 0)."""
        pages = _class_pages(nbytes)
        with self._lock:
            if not self.cache_limit_set:
                wanted = min(_CACHED_BLOCKS * pages * PAGE, self._cache_most)
                self.cache_limit = max(self.cache_limit, wanted)
            freed = self._free.get(pages)
            if freed:
                segment, slot = freed.pop()
                self.cached -= pages * PAGE
            else:
                segment = self._segment_with_room(pages)
                slot, segment.handed = segment.handed, segment.handed + 1
            block = SharedBlock(self, segment, slot, nbytes)
            segment.used[slot] = block
            self.in_use += pages * PAGE
            self.peak = max(self.peak, self.in_use)
            return block

    def _segment_with_room(self, pages: int) -> Segment:
        """A segment of the class with a slot never handed out, or a new one."""
        for segment in self._segments.values():
            if segment.data_pages == pages and segment.handed < segment.slots:
                return segment
        block_bytes = (pages + 2) * PAGE
        slots = max(1, SEGMENT_BYTES // block_bytes)
        fd = shared_memory_file(slots * block_bytes + PAGE)
        try:
            mapping = Mapping(fd)
        except OSError:
            os.close(fd)
            raise
        segment = Segment(next(_segment_ids), mapping, pages, slots)
        self._segments[segment.id] = segment
        bisect.insort(self._bases, (mapping.address, segment.id))
        return segment

    def release(self, block: SharedBlock) -> None:
        with self._lock:
            segment = block.segment
            if segment.used.get(block.slot) is not block:
                return
            del segment.used[block.slot]
            self._free.setdefault(segment.data_pages, []).append((segment, block.slot))
            self.in_use -= block.capacity
            self.cached += block.capacity
            if self.cached > self.cache_limit:
                self._trim(self.cache_limit)

    def find(self, address: int, nbytes: int) -> tuple[SharedBlock, int] | None:
        """The block in use whose data holds [address, address + nbytes), and the offset
        of `address` in its segment; None for other memory."""
        with self._lock:
            at = bisect.bisect_right(self._bases, (address, 1 << 62)) - 1
            if at < 0:
                return None
            segment = self._segments[self._bases[at][1]]
            offset = address - segment.mapping.address
            slot, within = divmod(offset - PAGE, segment.block_bytes)
            block = segment.used.get(slot) if 0 <= slot < segment.slots else None
            if block is None or within + nbytes > block.capacity:
                return None
            return block, offset

    def segment(self, segment_id: int) -> Segment:
        return self._segments[segment_id]

    # --- the cache ---------------------------------------------------------------------

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.in_use

    def set_cache_limit(self, limit: int) -> int:
        """Keeps at most `limit` bytes of freed blocks; returns the limit before."""
        with self._lock:
            previous, self.cache_limit = self.cache_limit, max(0, int(limit))
            self.cache_limit_set = True
            self._trim(self.cache_limit)
            return previous

    def clear_cache(self) -> None:
        """Gives back every segment none of whose blocks is in use."""
        with self._lock:
            self._trim(0)

    def _trim(self, limit: int) -> None:
        """Unmaps segments with no block in use, largest first, until at most `limit`
        bytes of freed blocks are kept."""
        idle = sorted((s for s in self._segments.values() if not s.used),
                      key=lambda s: -s.data_pages)
        for segment in idle:
            if self.cached <= limit:
                return
            listed = self._free.get(segment.data_pages, [])
            mine = [entry for entry in listed if entry[0] is segment]
            self._free[segment.data_pages] = [e for e in listed if e[0] is not segment]
            self.cached -= len(mine) * segment.data_pages * PAGE
            del self._segments[segment.id]
            self._bases.remove((segment.mapping.address, segment.id))
            segment.mapping.close()
            self.forgotten.append(segment.id)

    def privatize(self) -> None:
        """In a forked child: the blocks in use become private copies (their arrays keep
        their values; neither process sees the other's writes), the rest is given up."""
        for segment in self._segments.values():
            segment.mapping.privatize([(segment.data_offset(slot), segment.data_pages * PAGE)
                                       for slot in segment.used])
        self._free.clear()
        self.cached = 0

    def take_forgotten(self) -> list[int]:
        """The segments unmapped since the last call (the worker unmaps them too)."""
        with self._lock:
            gone, self.forgotten = self.forgotten, []
            return gone


_heap: SharedHeap | None = None
_heap_lock = threading.Lock()
_segment_ids = itertools.count(1)  # unique in a process and the children it forks


def _in_forked_child() -> None:
    global _heap
    inherited, _heap = _heap, None
    if inherited is not None:
        inherited.privatize()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


def heap() -> SharedHeap:
    """This process's heap of shared memory."""
    global _heap
    with _heap_lock:
        if _heap is None:
            _heap = SharedHeap()
        return _heap
