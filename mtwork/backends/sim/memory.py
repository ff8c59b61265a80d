"""A dispatch's memory as the emulator's launcher sees it: one pointer table.

Slot ``n`` of the table holds the address of ``[[buffer(n)]]``; slot
``THREADGROUP_SLOT_BASE + n`` the offset of ``[[threadgroup(n)]]`` in the group's
threadgroup memory (those arguments sit at its start, in index order). Fresh buffers are
made here (poisoned or filled); bound ones are used in place (as numpy views of mx
arrays, made row-contiguous where the kernel wants that); buffers the body form derives
from an input (its shape, strides, ndim) are computed from that input.

Every buffer starts at a multiple of 16 bytes, as Metal's do: vector loads of a buffer
cast to ``float4 *`` need it (an aligned SSE load of a misaligned address faults). Bound
memory that starts elsewhere (an mx array's data sits 8 bytes past an alignment on
MLX's CPU allocator) runs on an aligned copy, copied back afterwards (`settle`), so a
kernel that writes through it writes the caller's memory as on Metal.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...buffers import allocate, initialise, numpy_view
from ...dispatch import Bound, Dispatch, Fresh, Param, Program
from .arena import ALIGN
from .sources import THREADGROUP_SLOT_BASE

__all__ = ["Memory"]


def _derived(kind: str, view: np.ndarray) -> np.ndarray:
    if kind == "shape":
        return np.array(view.shape, dtype=np.int32)
    if kind == "strides":
        return np.array([s // view.itemsize for s in view.strides], dtype=np.int64)
    return np.array(view.ndim, dtype=np.int32)


def _view(bound: Bound) -> np.ndarray:
    view = numpy_view(bound.array)
    if bound.contiguous or view.ndim == 0:
        view = np.ascontiguousarray(view)
    return view


def _aligned_copy(view: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `view` whose data starts at a multiple of `ALIGN`."""
    raw = np.empty(view.nbytes + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    out = raw[skip:skip + view.nbytes].view(view.dtype).reshape(view.shape)
    out[...] = view
    return out


@dataclass
class Memory:
    """The arrays of one attempt at a dispatch, and the table that points at them."""

    program: Program
    dispatch: Dispatch
    # Makes the memory of a fresh buffer (default: a new array); the worker process
    # gives views of the memory it shares with mtwork.
    place: Callable[[int, Fresh], np.ndarray] | None = None
    arrays: dict[int, np.ndarray] = field(default_factory=dict)  # by buffer index
    # Bound memory that did not start aligned, by index: `arrays` holds an aligned copy.
    misaligned: dict[int, np.ndarray] = field(default_factory=dict)
    table: ctypes.Array = field(init=False)
    threadgroup_bytes: int = field(init=False)  # taken by [[threadgroup(n)]] arguments

    def __post_init__(self) -> None:
        buffers = self.dispatch.buffers
        for index, buf in buffers.items():
            if isinstance(buf, Fresh):
                self.arrays[index] = (allocate(buf.dtype, buf.shape, buf.fill)
                                      if self.place is None else
                                      initialise(self.place(index, buf), buf.dtype, buf.fill))
            else:
                self.arrays[index] = self._aligned(index, _view(buf))
        for p in self.program.params:
            if p.derived is not None:
                kind, source = p.derived
                self.arrays[p.index] = _derived(kind, self.arrays[source])  # type: ignore
        sizes = dict(sorted(self.dispatch.threadgroup_memory.items()))
        slots = max([THREADGROUP_SLOT_BASE + i + 1 for i in sizes]
                    + [i + 1 for i in self.arrays] + [1])
        self.table = (ctypes.c_void_p * slots)()
        for index, arr in self.arrays.items():
            self.table[index] = arr.ctypes.data if arr.size else None
        offset = 0
        for index, size in sizes.items():
            self.table[THREADGROUP_SLOT_BASE + index] = offset
            offset += size
        self.threadgroup_bytes = offset

    def _aligned(self, index: int, view: np.ndarray) -> np.ndarray:
        """`view`, or an aligned copy of it (one copy for memory bound at several
        indices, which stays one buffer)."""
        if not (view.size and view.flags.c_contiguous and view.ctypes.data % ALIGN):
            return view
        same = [i for i, o in self.misaligned.items()
                if (o.ctypes.data, o.nbytes) == (view.ctypes.data, view.nbytes)]
        self.misaligned[index] = view
        if same:
            shared = self.arrays[same[0]].reshape(-1).view(np.uint8)
            return shared.view(view.dtype).reshape(view.shape)
        return _aligned_copy(view)

    def kind(self, p: Param) -> str:
        """"fresh", "writable" (bound, written in place), "input" or "internal"."""
        if p.derived is not None:
            return "internal"
        buf = self.dispatch.buffers.get(p.index)  # type: ignore[arg-type]
        if isinstance(buf, Fresh):
            return "fresh"
        return "writable" if buf is not None and buf.writable else "input"

    def written(self) -> dict[int, np.ndarray]:
        """The buffers a caller gets back: fresh ones and writable bound ones."""
        return {p.index: self.arrays[p.index] for p in self.program.params  # type: ignore
                if p.kind == "buffer" and p.index in self.arrays
                and self.kind(p) in ("fresh", "writable")}

    def snapshot(self) -> dict[int, np.ndarray]:
        """Copies of the writable bound buffers, to undo an attempt that must run again."""
        return {i: a.copy() for i, a in self.written().items()
                if not isinstance(self.dispatch.buffers.get(i), Fresh)}

    def settle(self) -> None:
        """Copies what the kernel left in the aligned copies back to the caller's memory
        (written through a pointer, as the kernel wrote it: an mx array's numpy view may
        be marked read-only), and puts that memory back in `arrays`."""
        for index, original in self.misaligned.items():
            ctypes.memmove(original.ctypes.data, self.arrays[index].ctypes.data,
                           original.nbytes)
            self.arrays[index] = original
        self.misaligned.clear()

    def restore(self, saved: dict[int, np.ndarray]) -> None:
        for index, copy in saved.items():
            np.copyto(self.arrays[index], copy)
