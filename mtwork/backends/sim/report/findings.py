"""The sanitizer's side of a sim dispatch: describing the buffers to the runtime, and
turning what it recorded into a `SanitizerReport` at the author's source lines.

Each buffer is bounded by the memory it spans (a strided view by the bytes its elements
reach, not by its data pointer and size), and elements are counted from its data pointer,
as the kernel indexes it; outputs get a written-byte shadow, so outputs never written
show up afterwards.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from ....buffers import byte_span
from ....dispatch import Dispatch, Program
from ....errors import KernelDeadlock, KernelFault, ThreadgroupMemoryError
from ....kernel_log import KernelLog, Triple
from ....sanitizer import Finding, SanitizerReport
from ..compile.translation import Translation
from ..run import abi, runtime
from ..run.memory import UNBOUND_SPAN, Memory, unbound_index
from .logs import threads_named
from .places import Places
from .symbolizer import symbolize

__all__ = ["describe_buffers", "fault_finding", "quote_messages", "report", "unbound_read"]


def _buffer_params(program: Program) -> list:
    return [p for p in program.params if p.kind == "buffer"]


def describe_buffers(memory: Memory) -> abi.Sanitizing:
    """What the runtime checks accesses against: every buffer, and the pointer table. An
    unbound buffer's slot is described as an input, so that reading it is no finding but
    the fault that names it (`unbound_index`)."""
    unbound = set(memory.dispatch.unbound)
    params = [p for p in _buffer_params(memory.program)
              if p.index in memory.arrays or p.index in unbound]
    infos = (abi.BufferInfo * (len(params) + 1))()
    shadows: list[np.ndarray] = []
    for info, p in zip(infos, params):
        if p.index in unbound:
            info.base, info.size = memory.table[p.index], UNBOUND_SPAN
            info.element_size, info.name, info.kind = 1, p.name.encode(), abi.BUFFER_INPUT
            shadows.append(np.zeros(0, dtype=np.uint8))
            continue
        arr = memory.arrays[p.index]
        lo, hi = byte_span(arr)
        info.base, info.size = lo, hi - lo
        info.element_size = max(1, arr.itemsize)
        info.name = p.name.encode()
        kind = memory.kind(p)
        if kind in ("fresh", "writable"):
            info.kind = abi.BUFFER_OUTPUT
            shadow = np.zeros(max(1, hi - lo), dtype=np.uint8)
            shadows.append(shadow)
            info.written = shadow.ctypes.data
        else:
            # MLX's shape, strides and ndim helpers are read-only inputs of the kernel too:
            # an access past one of them is that buffer's.
            info.kind = abi.BUFFER_INPUT
            shadows.append(np.zeros(0, dtype=np.uint8))
    table = infos[len(params)]
    table.base = ctypes.addressof(memory.table)
    table.size = ctypes.sizeof(memory.table)
    table.element_size = 8
    table.kind = abi.BUFFER_INTERNAL
    table.name = b"<buffer table>"
    return abi.Sanitizing(infos, (abi.Finding * 256)(), shadows=shadows,
                              names=[p.name for p in params], indices=[p.index for p in params])


def _origin(memory: Memory, index: int) -> int:
    """Elements from the low end of a buffer's span to its data pointer (a reversed
    view's element 0 is its highest)."""
    arr = memory.arrays[index]
    return (arr.ctypes.data - byte_span(arr)[0]) // max(1, arr.itemsize)


# Findings about two threads: what the other one did.
_OTHERS = {"RACE": "", "SIMD_DIVERGENCE": "elsewhere",
           "BARRIER_DIVERGENCE": "elsewhere, or returned"}


class _Reader:
    """Turns the runtime's records of one dispatch into `Finding`s."""

    def __init__(self, name: str, tu: Translation, library_path, sanitizing: abi.Sanitizing,
                 memory: Memory) -> None:
        self.name, self.sanitizing, self.memory = name, sanitizing, memory
        offsets = [o for f in sanitizing.found for o in (f.pc, *f.callers) if o]
        self.places = Places(tu, symbolize(library_path, offsets))
        self.kinds = {k.code: k for k in abi.finding_kinds().values()}

    def finding(self, f: abi.Finding) -> Finding:
        kind = self.kinds.get(f.kind)
        name = kind.name if kind else ""
        stack = self.places.stack([f.pc, *f.callers])
        line, called_from = self.places.line(stack)
        fields = dict(kind=kind.text if kind else f"finding {f.kind}", kernel=self.name,
                      thread=tuple(f.thread), threadgroup=tuple(f.group), line=line,
                      called_from=called_from, count=int(f.count))
        if name == "ARRAY_INDEX":
            fields |= self._array_index(f, stack)
        elif name == "INACTIVE_LANE":
            fields |= self._inactive_lane(f)
        else:
            fields |= self._memory(f, name)
        return Finding(**fields)

    def _memory(self, f: abi.Finding, name: str) -> dict:
        s = self.sanitizing
        where, element = "", None
        if f.buffer >= 0:
            if f.buffer < len(s.names):
                where = s.names[f.buffer]
                element = f.element - _origin(self.memory, s.indices[f.buffer])
            else:
                where, element = "<buffer table>", f.element
        elif 0 <= f.tg_array < len(s.arrays):
            where, element = s.arrays[f.tg_array][0], f.element
        fields: dict = dict(where=where, element=element,
                            access=("write" if f.write else "read") if where else "")
        if name in _OTHERS:
            fields["other_thread"] = tuple(f.other)
            fields["other_access"] = (("write" if f.other_write else "read") if name == "RACE"
                                      else _OTHERS[name])
        return fields

    def _array_index(self, f: abi.Finding, stack) -> dict:
        s = self.sanitizing
        type_name = s.arrays[f.tg_array][0] if 0 <= f.tg_array < len(s.arrays) else ""
        array, access = self.places.subscripted(stack)
        threadgroup = {n for n, _ in s.arrays if not n.startswith("'")}
        role = "threadgroup" if array in threadgroup else "thread-private"
        return dict(where=array or f"{role} array", element=int(f.element), access=access,
                    detail=f"{role} array of type {type_name}" if type_name else "")

    def _inactive_lane(self, f: abi.Finding) -> dict:
        exists = tuple(f.other) != (0xFFFFFFFF,) * 3
        state = ("is inactive (it has returned, or waits at a barrier or another SIMD-group "
                 "function)" if exists else "does not exist (the SIMD-group is partial)")
        return dict(other_thread=tuple(f.other) if exists else None, other_access="inactive",
                    detail=f"it reads lane {f.element}, which {state}: Metal leaves the "
                           "result undefined")


def report(name: str, tu: Translation, library_path, sanitizing: abi.Sanitizing,
           memory: Memory, finished: bool = True) -> SanitizerReport:
    """The findings of one sanitized dispatch (and, when it finished, unwritten outputs)."""
    reader = _Reader(name, tu, library_path, sanitizing, memory)
    out = SanitizerReport(name, _merged(reader.finding(f) for f in sanitizing.found))
    if finished:
        out.findings += _unwritten_outputs(name, memory, sanitizing)
    return out


def _merged(findings: Iterable[Finding]) -> list[Finding]:
    """One finding for those that differ only in their count (accesses at several
    places of the compiled code that are one place of the source)."""
    merged: dict[Finding, int] = {}
    for f in findings:
        key = replace(f, count=1)
        merged[key] = merged.get(key, 0) + f.count
    return [replace(f, count=n) for f, n in merged.items()]


def _unwritten_outputs(name: str, memory: Memory,
                       sanitizing: abi.Sanitizing) -> list[Finding]:
    """Fresh buffers without a fill that have elements the kernel never wrote."""
    found = []
    fresh = {p.index: p for p in _buffer_params(memory.program) if memory.kind(p) == "fresh"}
    for index, shadow in zip(sanitizing.indices, sanitizing.shadows):
        p = fresh.get(index)
        if p is None:
            continue
        buf = memory.arrays[index]
        if not buf.size or memory.dispatch.buffers[index].fill is not None:
            continue
        per_element = shadow[: buf.nbytes].reshape(buf.size, buf.itemsize).all(axis=1)
        missing = np.flatnonzero(~per_element)
        if missing.size:
            found.append(Finding(
                kind=abi.finding_kinds()["UNWRITTEN_OUTPUT"].text, kernel=name,
                where=p.name,
                element=int(missing[0]), access="write", count=int(missing.size),
                detail=f"{missing.size} of {buf.size} elements unwritten and no init_value",
            ))
    return found


def _threads(f: Finding) -> list[tuple[Triple, Triple]]:
    """The (threadgroup, thread) pairs a finding is about: its thread, the other thread
    of a race or divergence, or those its detail names (a fault)."""
    if f.threadgroup is None or f.thread is None:
        return threads_named(f.detail)
    pairs = [(f.threadgroup, f.thread)]
    if f.other_thread is not None and f.other_access != "inactive":
        pairs.append((f.threadgroup, f.other_thread))
    return pairs  # type: ignore[return-value]


def quote_messages(report: SanitizerReport, log: KernelLog | None) -> None:
    """Each finding with the last messages its threads logged, when they logged any."""
    if log is None or not log.messages:
        return
    report.findings[:] = [replace(f, messages=tuple(said)) if (said := log.last_words(
        _threads(f))) else f for f in report.findings]


def fault_finding(name: str, fault: KernelFault) -> Finding | None:
    """A fault as a finding, unless the sanitizer stopped the kernel (it reported why)."""
    if isinstance(fault, runtime.SanitizerStop):
        return None
    kinds = {ThreadgroupMemoryError: "threadgroup memory over budget",
             KernelDeadlock: "barrier divergence"}
    kind = next((k for cls, k in kinds.items() if isinstance(fault, cls)), "kernel fault")
    return Finding(kind=kind, kernel=name, detail=fault.detail)


_FAULT_ADDRESS = re.compile(r"at address (0x[0-9a-fA-F]+)(?: in (?P<where>.*))?")


def unbound_read(program: Program, call: Dispatch, fault: KernelFault) -> TypeError | None:
    """The error naming the unbound buffer a fault read or wrote, when it was one (its slot
    points where nothing is mapped, `run.memory.unbound_index`)."""
    found = _FAULT_ADDRESS.search(fault.detail)
    index = unbound_index(int(found.group(1), 16)) if found else None
    if index is None or index not in call.unbound:
        return None
    name = next((p.name for p in program.params if p.kind == "buffer" and p.index == index),
                "")
    where = f" ({found.group('where')})" if found and found.group("where") else ""
    return TypeError(f"kernel `{program.label}`: no binding for buffer({index}) `{name}`, "
                     f"which the kernel reads{where}; bind it (Metal leaves only buffers a "
                     f"kernel never reads unbound)")
