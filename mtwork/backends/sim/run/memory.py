"""A dispatch's memory as the emulator's launcher sees it: one pointer table.

Slot ``n`` of the table holds the address of ``[[buffer(n)]]``; slot
``THREADGROUP_SLOT_BASE + n`` the offset of ``[[threadgroup(n)]]`` in the group's
threadgroup memory (those arguments sit at its start, in index order). Fresh buffers are
made here (poisoned or filled), unless the worker places them in its arena; bound ones are
used in place (as numpy views of mx arrays, made row-contiguous where the kernel wants
that); buffers the body form derives from an input (its shape, strides, ndim) are
computed from that input.

A buffer mtwork makes starts at a multiple of 16 bytes, as Metal's do. Bound memory is
used where it is: the kernel's code assumes no more than `compiler.POINTER_ALIGN` bytes of
alignment of what a pointer reaches (an mx array's data sits 8 bytes past a 16-byte
boundary on MLX's CPU allocator), unless the program declares an aligned type
(`msl.alignment`: its accesses keep the alignment it declares, and an aligned x86 vector
move of a misaligned address faults). Then bound memory that does not start at 16 bytes
runs on an aligned copy of the bytes it spans (strided views keep their layout), copied
back afterwards (`settle`), so a kernel that writes through it writes the caller's memory
as on Metal; memory bound at several indices stays one copy.

What is made here comes from `arena.guarded`: each buffer ends at a page of slack before a
guard page, so in this process too a write far past the end of a fresh output or of a
copy faults (a `KernelFault`) instead of corrupting the Python heap. Bound memory used in
place (an aligned numpy array) is the caller's own and has no guard page.
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .... import dtypes
from ....buffers import byte_span, initialise, numpy_view
from ....dispatch import Bound, Dispatch, Fresh, Param, Program
from ....msl.alignment import declares_alignment
from ..compile.compiler import POINTER_ALIGN
from ..compile.sources import THREADGROUP_SLOT_BASE
from .arena import ALIGN, guarded

__all__ = ["UNBOUND_SPAN", "Memory", "unbound_index"]

_CONST = re.compile(r"\bconst(?:ant)?\b")
# An unbound buffer's slot points into the lowest 64 KiB of the address space, which no
# process maps, 2 KiB apart per index: a read faults there, and the fault's address names
# the buffer (`unbound_index`).
_UNBOUND_SPACING = UNBOUND_SPAN = 1 << 11
_UNBOUND_LIMIT = 1 << 16


def unbound_index(address: int) -> int | None:
    """The ``[[buffer(n)]]`` index whose unbound slot `address` falls in, or None."""
    if not _UNBOUND_SPACING <= address < _UNBOUND_LIMIT:
        return None
    return address // _UNBOUND_SPACING - 1


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


def _declares_alignment(program: Program) -> bool:
    src = program.sources
    texts = (src.prelude, src.text, *(text for _, text in src.files))
    folder = src.path.parent if src.path is not None else None
    return declares_alignment(texts, folder, src.search_dirs)


@dataclass
class Memory:
    """The arrays of one attempt at a dispatch, and the table that points at them."""

    program: Program
    dispatch: Dispatch
    # Makes the memory of a fresh buffer (default: guarded memory of its own); the worker
    # process gives views of the memory it shares with mtwork.
    place: Callable[[int, Fresh], np.ndarray] | None = None
    arrays: dict[int, np.ndarray] = field(default_factory=dict)  # by buffer index
    # Bound memory that did not start aligned, by index: `arrays` holds an aligned copy.
    misaligned: dict[int, np.ndarray] = field(default_factory=dict)
    table: ctypes.Array = field(init=False)
    threadgroup_bytes: int = field(init=False)  # taken by [[threadgroup(n)]] arguments

    def __post_init__(self) -> None:
        buffers = self.dispatch.buffers
        views = {i: _view(b) for i, b in buffers.items() if isinstance(b, Bound)}
        need = ALIGN if _declares_alignment(self.program) else POINTER_ALIGN
        self.misaligned = {i: v for i, v in views.items() if v.size and v.ctypes.data % need}
        self.arrays.update({i: v for i, v in views.items() if i not in self.misaligned})
        fresh = {i: b for i, b in buffers.items() if isinstance(b, Fresh)}
        if self.place is not None:
            self.arrays.update({i: initialise(self.place(i, b), b.dtype, b.fill)
                                for i, b in fresh.items()})
            fresh = {}
        self._make(fresh)
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
        for index in self.dispatch.unbound:
            self.table[index] = (index + 1) * _UNBOUND_SPACING
        offset = 0
        for index, size in sizes.items():
            self.table[THREADGROUP_SLOT_BASE + index] = offset
            offset += size
        self.threadgroup_bytes = offset

    def _make(self, fresh: dict[int, Fresh]) -> None:
        """Memory for `fresh` buffers and for an aligned copy of each misaligned span, from
        `arena.guarded`, guarded unless sanitized (the sanitizer checks each access before it
        happens and lets an out-of-bounds read go on: a guard page would make it a fault).
        A copy holds the bytes its view spans, placed so that element 0 starts aligned
        (strided views keep their layout); memory bound at several indices stays one
        copy."""
        if not fresh and not self.misaligned:
            return
        types = {i: np.dtype(dtypes.storage_numpy_dtype(b.dtype)) for i, b in fresh.items()}
        spans: dict[tuple[int, int], list[int]] = {}
        for index, view in self.misaligned.items():
            spans.setdefault(byte_span(view), []).append(index)
        pads = {span: -(self.misaligned[ix[0]].ctypes.data - span[0]) % ALIGN
                for span, ix in spans.items()}
        sizes = ([math.prod(b.shape) * types[i].itemsize for i, b in fresh.items()]
                 + [pads[(lo, hi)] + hi - lo for lo, hi in spans])
        memory = guarded(tuple(sizes), guard=self.dispatch.options.sanitize is None)
        for raw, (index, buf) in zip(memory, fresh.items()):
            shaped = raw.view(types[index]).reshape(tuple(buf.shape))
            self.arrays[index] = initialise(shaped, buf.dtype, buf.fill)
        for raw, ((lo, hi), indices) in zip(memory[len(fresh):], spans.items()):
            pad = pads[(lo, hi)]
            raw[pad:] = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))
            for index in indices:
                view = self.misaligned[index]
                self.arrays[index] = np.ndarray(view.shape, view.dtype, buffer=raw,
                                                offset=pad + view.ctypes.data - lo,
                                                strides=view.strides)

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
        """The buffers a caller gets back: fresh ones and writable bound ones (aligned
        copies settled first)."""
        self.settle()
        return {i: self.arrays[i] for i in self._returned()}

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

    def settle(self) -> None:
        """Copies what the kernel left in the aligned copies back to the caller's memory,
        every one of them: a kernel may write through a pointer it was given read-only, as
        on a GPU (the metal backend's wrapper writes its inputs so); written through a
        pointer, since an mx array's numpy view may be marked read-only. Puts that memory
        back in `arrays`."""
        for index, original in self.misaligned.items():
            lo, hi = byte_span(original)
            copy_lo = byte_span(self.arrays[index])[0]
            ctypes.memmove(lo, copy_lo, hi - lo)
            self.arrays[index] = original
        self.misaligned.clear()

    def restore(self, saved: dict[int, np.ndarray]) -> None:
        for index, copy in saved.items():
            np.copyto(self.arrays[index], copy)
