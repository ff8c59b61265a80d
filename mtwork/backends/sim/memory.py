"""A dispatch's memory as the emulator's launcher sees it: one pointer table.

Slot ``n`` of the table holds the address of ``[[buffer(n)]]``; slot
``THREADGROUP_SLOT_BASE + n`` the offset of ``[[threadgroup(n)]]`` in the group's
threadgroup memory (those arguments sit at its start, in index order). Fresh buffers are
made here (poisoned or filled); bound ones are used in place (as numpy views of mx
arrays, made row-contiguous where the kernel wants that); buffers the body form derives
from an input (its shape, strides, ndim) are computed from that input.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...buffers import allocate, initialise, numpy_view
from ...dispatch import Bound, Dispatch, Fresh, Param, Program
from .sources import THREADGROUP_SLOT_BASE

__all__ = ["Memory"]

_CONST = re.compile(r"\bconst(?:ant)?\b")


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


@dataclass
class Memory:
    """The arrays of one attempt at a dispatch, and the table that points at them."""

    program: Program
    dispatch: Dispatch
    # Makes the memory of a fresh buffer (default: a new array); the worker process
    # gives views of the memory it shares with mtwork.
    place: Callable[[int, Fresh], np.ndarray] | None = None
    arrays: dict[int, np.ndarray] = field(default_factory=dict)  # by buffer index
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
                self.arrays[index] = _view(buf)
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

    def snapshot(self, every: bool = False) -> dict[int, np.ndarray]:
        """Copies of the bound buffers a kernel may write (writable ones, and inputs its
        signature does not make const, which it writes in place as on Metal; `every`
        bound buffer when the kernel may write through a const one, as the metal
        backend's wrapper does), to undo an attempt that must run again."""
        out = {}
        for p in self.program.params:
            buf = self.dispatch.buffers.get(p.index)  # type: ignore[arg-type]
            if (p.kind == "buffer" and p.derived is None and isinstance(buf, Bound)
                    and (every or buf.writable or not _CONST.search(p.type_text))):
                out[p.index] = self.arrays[p.index].copy()  # type: ignore[index]
        return out

    def restore(self, saved: dict[int, np.ndarray]) -> None:
        for index, copy in saved.items():
            np.copyto(self.arrays[index], copy)
