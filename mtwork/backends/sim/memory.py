"""A dispatch's memory as the emulator's launcher sees it: one pointer table.

Slot ``n`` of the table holds the address of ``[[buffer(n)]]``; slot
``THREADGROUP_SLOT_BASE + n`` the offset of ``[[threadgroup(n)]]`` in the group's
threadgroup memory (those arguments sit at its start, in index order). Fresh buffers are
made here (poisoned or filled); bound ones are used in place (as numpy views of mx
arrays, made row-contiguous where the kernel wants that) unless they start off Metal's
16-byte alignment (MLX's CPU arrays may start at any multiple of 8): those run on an
aligned copy that is written back, since the kernel's vector loads assume alignment.
Buffers the body form derives from an input (its shape, strides, ndim) are computed from
that input.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...buffers import allocate, byte_span, initialise, numpy_view
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
    """`view`'s bytes copied to memory that starts on an `ALIGN` boundary, with the same
    layout (strides, and element 0 at the same offset into its span)."""
    lo, hi = byte_span(view)
    raw = np.empty(hi - lo + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    raw[start : start + hi - lo] = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo))
                                                         .from_address(lo))
    return np.ndarray(view.shape, view.dtype, buffer=raw, offset=start + view.ctypes.data - lo,
                      strides=view.strides)


@dataclass
class Memory:
    """The arrays of one attempt at a dispatch, and the table that points at them."""

    program: Program
    dispatch: Dispatch
    # Makes the memory of a fresh buffer (default: a new array); the worker process
    # gives views of the memory it shares with mtwork.
    place: Callable[[int, Fresh], np.ndarray] | None = None
    arrays: dict[int, np.ndarray] = field(default_factory=dict)  # by buffer index
    # The caller's memory of bound buffers that run on an aligned copy, by buffer index.
    detached: dict[int, np.ndarray] = field(default_factory=dict)
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
                view = _view(buf)
                if view.size and view.ctypes.data % ALIGN:
                    self.detached[index] = view
                    view = _aligned_copy(view)
                self.arrays[index] = view
        for p in self.program.params:
            if p.derived is not None:
                kind, source = p.derived
                self.arrays[p.index] = _derived(kind, self.arrays[source])  # type: ignore
        sizes = dict(sorted(self.dispatch.threadgroup_memory.items()))
        # A slot for every buffer parameter, bound or not: the launcher reads each one.
        buffer_slots = [p.index + 1 for p in self.program.params
                        if p.kind == "buffer" and p.index is not None]
        slots = max([THREADGROUP_SLOT_BASE + i + 1 for i in sizes]
                    + [i + 1 for i in self.arrays] + buffer_slots + [1])
        self.table = (ctypes.c_void_p * slots)()
        for index, arr in self.arrays.items():
            self.table[index] = arr.ctypes.data if arr.size else None
        offset = 0
        for index, size in sizes.items():
            self.table[THREADGROUP_SLOT_BASE + index] = offset
            offset += size
        self.threadgroup_bytes = offset

    def kind(self, p: Param) -> str:
        """"fresh", "writable" (bound, written in place), "input" or "internal"."""
        if p.derived is not None:
            return "internal"
        buf = self.dispatch.buffers.get(p.index)  # type: ignore[arg-type]
        if isinstance(buf, Fresh):
            return "fresh"
        return "writable" if buf is not None and buf.writable else "input"

    def _returned(self) -> list[int]:
        return [p.index for p in self.program.params  # type: ignore[misc]
                if p.kind == "buffer" and p.index in self.arrays
                and self.kind(p) in ("fresh", "writable")]

    def written(self) -> dict[int, np.ndarray]:
        """The buffers a caller gets back: fresh ones and writable bound ones. Buffers that
        ran on an aligned copy are first copied back into the caller's memory, every one
        of them: a kernel may write through a pointer it was given read-only, as on a GPU
        (the metal backend's wrapper writes its inputs so)."""
        for index, original in self.detached.items():
            if original.flags.writeable:
                np.copyto(original, self.arrays[index])
        return {i: self.detached.get(i, self.arrays[i]) for i in self._returned()}

    def snapshot(self) -> dict[int, np.ndarray]:
        """Copies of the writable bound buffers, to undo an attempt that must run again."""
        return {i: self.arrays[i].copy() for i in self._returned()
                if not isinstance(self.dispatch.buffers.get(i), Fresh)}

    def restore(self, saved: dict[int, np.ndarray]) -> None:
        for index, copy in saved.items():
            np.copyto(self.arrays[index], copy)
