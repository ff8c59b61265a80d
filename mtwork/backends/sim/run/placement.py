"""Where an isolated call's buffers sit in shared memory, and what is copied.

A buffer whose memory already is a block of the shared heap (an output of an earlier
kernel, or the MLX output this call writes: `Dispatch.into`) is used where it is, with no
copy. Any other buffer gets a staging block for the call: a bound buffer's bytes are
copied in, and the written ones copied out afterwards (`Placed.finish`). The worker opens
each block's data and slack for the call (every segment whole for a sanitized call: the
sanitizer lets an out-of-bounds read go on, which must not fault) and zeroes the slack of
the blocks made for the call.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ....buffers import byte_span, numpy_view, to_mx
from ....dispatch import Bound, Dispatch, Fresh
from ....dtypes import storage_numpy_dtype
from .arena import ALIGN, PAGE, Placement, Range
from .shared import SharedBlock, SharedHeap

__all__ = ["Placed", "Span", "place"]

# How the kernel sees a buffer's bytes: (nbytes spanned, offset of element 0 in them,
# shape, byte strides, numpy dtype).
Span = tuple[int, int, tuple[int, ...], tuple[int, ...], str]


def _source(buf: Bound) -> tuple[np.ndarray, int, Span]:
    """The view whose bytes the kernel reads for a bound buffer (kept alive while they
    are used), the address they start at, and how the kernel sees them."""
    view = numpy_view(buf.array)
    if buf.contiguous or view.ndim == 0:
        view = np.ascontiguousarray(view)
    if view.flags.c_contiguous:  # its bytes start at element 0
        return view, view.ctypes.data, (view.nbytes, 0, view.shape, view.strides,
                                        view.dtype.str)
    lo, hi = byte_span(view)
    return view, lo, (hi - lo, view.ctypes.data - lo, view.shape, view.strides,
                      view.dtype.str)


def _owners(indices: list[int], spans: dict[int, Span],
            addresses: dict[int, int]) -> tuple[int, ...]:
    """For each buffer, the buffer whose memory it uses: itself, or the first bound
    buffer over the very same memory (one buffer bound at several indices is one buffer
    in shared memory too, as one MTLBuffer is)."""
    first: dict[tuple[int, int], int] = {}
    owners = []
    for index in indices:
        nbytes = spans[index][0]
        if index in addresses and nbytes:  # the source spans the caller's very bytes
            owners.append(first.setdefault((addresses[index], nbytes), index))
        else:
            owners.append(index)
    return tuple(owners)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


@lru_cache(maxsize=1024)
def _fresh_span(shape: tuple[int, ...], dtype: mx.Dtype) -> Span:
    dt = np.dtype(storage_numpy_dtype(dtype))
    return math.prod(shape) * dt.itemsize, 0, shape, _c_strides(shape, dt.itemsize), dt.str


def _spec(buf: Bound | Fresh) -> tuple:
    """What the worker needs to rebuild a buffer besides its bytes."""
    if isinstance(buf, Fresh):
        return ("fresh", buf)
    return ("bound", buf.dtype, buf.writable)


@dataclass
class Placed:
    """One call's buffers in shared memory: where each is (`placements`), what the worker
    opens and zeroes, which buffers were staged (copied), and the blocks to give back."""

    placements: dict[int, Placement]
    opened: frozenset[Range]
    zeroed: tuple[Range, ...]
    staged: set[int]  # buffer indices whose memory is a staging block
    segments: set[int]  # the segments the call uses
    blocks: list[SharedBlock] = field(default_factory=list)  # staging blocks
    log: Placement | None = None  # the dispatch's log (its bytes: header and records)

    def with_log(self, block: SharedBlock, nbytes: int) -> None:
        """Puts the dispatch's log in `block` (kept by the caller beyond the call: it is
        read after the dispatch, also when the worker died): opened, and named in the
        plan."""
        self.log = Placement(block.segment.id, block.offset, nbytes, 0, (nbytes,), (1,), "|u1")
        self.segments.add(block.segment.id)
        self.opened = self.opened | {(block.segment.id, block.offset, block.capacity)}

    def worker_buffers(self, call: Dispatch) -> tuple:
        return tuple((i, self.placements[i], _spec(call.buffers[i]))
                     for i in sorted(call.buffers))

    def finish(self, heap: SharedHeap, written: tuple[int, ...], call: Dispatch,
               as_mx: bool) -> dict[int, np.ndarray | mx.array]:
        """The written buffers, copied out of staging blocks where they were staged: into
        the caller's writable numpy arrays, or the memory `call.into` gives, else into new
        arrays (``mx.array`` ones when `as_mx`: one copy is cheaper than two); then the
        staging blocks are given back."""
        buffers: dict[int, np.ndarray | mx.array] = {}
        try:
            for index in written:
                buf = call.buffers[index]
                target = call.into.get(index) if isinstance(buf, Fresh) else (
                    buf.array if buf.writable and isinstance(buf.array, np.ndarray) else None)
                if index not in self.staged:  # written where it is
                    buffers[index] = target if target is not None else numpy_view(buf.array)
                    continue
                p = self.placements[index]
                shared = heap.segment(p.segment).mapping.view(p)
                if target is not None:
                    np.copyto(target, shared)
                    buffers[index] = target
                elif as_mx and isinstance(buf, Fresh):
                    buffers[index] = to_mx(shared, buf.dtype)
                else:
                    buffers[index] = np.array(shared)
                del shared
        finally:
            self.release()
        return buffers

    def release(self) -> None:
        for block in self.blocks:
            block.release()
        self.blocks.clear()


def _memory_of(buf: Bound | Fresh, call: Dispatch, index: int,
               sources: dict[int, tuple[np.ndarray, int]]) -> int | None:
    """The address of the memory the call gives for a buffer (a bound buffer's bytes, a
    fresh one's MLX output), if any."""
    if isinstance(buf, Fresh):
        target = call.into.get(index)
        if target is None or not target.flags.c_contiguous or target.size == 0:
            return None
        return target.ctypes.data
    return sources[index][1]


def _tail(block: SharedBlock, offset: int, nbytes: int) -> Range:
    """The bytes past a buffer of `nbytes` at `offset` to the end of its block's slack."""
    start = offset + -(-nbytes // ALIGN) * ALIGN
    return block.segment.id, start, block.offset + block.capacity + PAGE - start


def place(heap: SharedHeap, call: Dispatch) -> Placed:
    """Places every buffer of `call` (module docstring), copying bound buffers that are
    not in shared memory into staging blocks."""
    indices = sorted(call.buffers)
    sources: dict[int, tuple[np.ndarray, int]] = {}
    spans: dict[int, Span] = {}
    for index in indices:
        buf = call.buffers[index]
        if isinstance(buf, Fresh):
            spans[index] = _fresh_span(tuple(buf.shape), buf.dtype)
        else:
            view, address, spans[index] = _source(buf)
            sources[index] = view, address
    owners = _owners(indices, spans, {i: a for i, (_, a) in sources.items()})
    placed = Placed({}, frozenset(), (), set(), set())
    opened: set[Range] = set()
    zeroed: list[Range] = []
    try:
        for index, owner in zip(indices, owners):
            if owner != index:
                first = placed.placements[owner]
                placed.placements[index] = Placement(first.segment, first.start, *spans[index])
                if owner in placed.staged:
                    placed.staged.add(index)
                continue
            buf, nbytes = call.buffers[index], spans[index][0]
            address = _memory_of(buf, call, index, sources)
            found = heap.find(address, nbytes) if address else None
            if found is not None:
                block, offset = found
                if isinstance(buf, Fresh):  # this call's output: its slack is ours
                    zeroed.append(_tail(block, offset, nbytes))
            else:
                block = heap.allocate(nbytes)
                placed.blocks.append(block)
                placed.staged.add(index)
                offset = block.offset
                if index in sources and nbytes:
                    ctypes.memmove(block.address, sources[index][1], nbytes)
                zeroed.append(_tail(block, offset, nbytes))
            placed.segments.add(block.segment.id)
            opened.add((block.segment.id, block.offset, block.capacity + PAGE))
            placed.placements[index] = Placement(block.segment.id, offset, *spans[index])
    except BaseException:
        placed.release()
        raise
    if call.options.sanitize:
        opened = {(s, 0, heap.segment(s).mapping.size) for s in placed.segments}
    placed.opened, placed.zeroed = frozenset(opened), tuple(zeroed)
    return placed
