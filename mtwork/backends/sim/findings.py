"""The sanitizer's side of a sim dispatch: describing the buffers to the runtime, and
turning what it recorded into a `SanitizerReport` at the author's source lines.

Each buffer is bounded by the memory it spans (a strided view by the bytes its elements
reach, not by its data pointer and size); outputs get a written-byte shadow, so outputs
never written show up afterwards.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from ...buffers import byte_span
from ...dispatch import Program
from ...errors import KernelDeadlock, KernelFault, ThreadgroupMemoryError
from ...sanitizer import Finding, SanitizerReport
from . import runtime
from .compiler import Translation
from .memory import Memory
from .symbolizer import symbolize

__all__ = ["describe_buffers", "fault_finding", "report"]


def _buffer_params(program: Program) -> list:
    return [p for p in program.params if p.kind == "buffer"]


def describe_buffers(memory: Memory) -> runtime.Sanitizing:
    """What the runtime checks accesses against: every buffer, and the pointer table."""
    params = [p for p in _buffer_params(memory.program) if p.index in memory.arrays]
    infos = (runtime.BufferInfo * (len(params) + 1))()
    shadows: list[np.ndarray] = []
    for info, p in zip(infos, params):
        arr = memory.arrays[p.index]
        lo, hi = byte_span(arr)
        info.base, info.size = lo, hi - lo
        info.element_size = max(1, arr.itemsize)
        info.name = p.name.encode()
        kind = memory.kind(p)
        if kind in ("fresh", "writable"):
            info.kind = runtime.BUFFER_OUTPUT
            shadow = np.zeros(max(1, hi - lo), dtype=np.uint8)
            shadows.append(shadow)
            info.written = shadow.ctypes.data
        else:
            info.kind = runtime.BUFFER_INPUT if kind == "input" else runtime.BUFFER_INTERNAL
            shadows.append(np.zeros(0, dtype=np.uint8))
    table = infos[len(params)]
    table.base = ctypes.addressof(memory.table)
    table.size = ctypes.sizeof(memory.table)
    table.element_size = 8
    table.kind = runtime.BUFFER_INTERNAL
    table.name = b"<buffer table>"
    return runtime.Sanitizing(infos, (runtime.Finding * 256)(), shadows=shadows,
                              names=[p.name for p in params], indices=[p.index for p in params])


def _is_file(frame_file: str, label: str) -> bool:
    # Debug info joins a relative `#line` name (``<generated>``, ``source``) to the
    # compiler's working folder.
    return frame_file == label or frame_file.endswith("/" + label)


def _source_line(tu: Translation, frames: Sequence[tuple[str, int]]) -> str:
    """The author's line of the innermost inlined frame in the author's files, and the
    call site in the main file when that frame is in one of the author's other files."""
    sources = tu.sources
    others = [str(p) for p, _ in sources.files]
    lines = []
    for file, line in frames:
        if _is_file(file, sources.label):
            found = sources.author_line(line)
            if found is not None:
                lines.append(f"{found[0]}:{found[1]}")
                break
        elif any(_is_file(file, other) for other in others):
            lines.append(f"{file}:{line}")
    if not lines:
        return ""
    return lines[0] + (f" (called from {lines[-1]})" if len(lines) > 1 else "")


def report(name: str, tu: Translation, library_path, sanitizing: runtime.Sanitizing,
           memory: Memory, finished: bool = True) -> SanitizerReport:
    """The findings of one sanitized dispatch (and, when it finished, unwritten outputs)."""
    lines = symbolize(library_path, [f.pc for f in sanitizing.found])
    kinds = runtime.finding_kinds()
    texts = {k.code: k.text for k in kinds.values()}
    pairs = {kinds[n].code for n in ("RACE", "SIMD_DIVERGENCE", "BARRIER_DIVERGENCE")}
    out = SanitizerReport(name)
    for f in sanitizing.found:
        kind = texts.get(f.kind, f"finding {f.kind}")
        where = ""
        if f.buffer >= 0:
            where = (sanitizing.names[f.buffer] if f.buffer < len(sanitizing.names)
                     else "<buffer table>")
        elif 0 <= f.tg_array < len(sanitizing.arrays):
            where = sanitizing.arrays[f.tg_array][0]
        located = lines.get(f.pc, [])
        out.findings.append(Finding(
            kind=kind,
            kernel=name,
            where=where,
            element=f.element if where else None,
            access=("write" if f.write else "read") if where else "",
            thread=tuple(f.thread),
            other_thread=tuple(f.other) if f.kind in pairs else None,
            other_access=(("write" if f.other_write else "read")
                          if f.kind == kinds["RACE"].code else ""),
            threadgroup=tuple(f.group),
            line=_source_line(tu, located) if located else "",
            count=int(f.count),
        ))
    if finished:
        out.findings += _unwritten_outputs(name, memory, sanitizing)
    return out


def _unwritten_outputs(name: str, memory: Memory,
                       sanitizing: runtime.Sanitizing) -> list[Finding]:
    """Fresh buffers without a fill that have elements the kernel never wrote."""
    found = []
    fresh = {p.index: p for p in _buffer_params(memory.program) if memory.kind(p) == "fresh"}
    for index, shadow in zip(sanitizing.indices, sanitizing.shadows):
        p = fresh.get(index)
        buf = memory.arrays[index]
        if p is None or not buf.size or memory.dispatch.buffers[index].fill is not None:
            continue
        per_element = shadow[: buf.nbytes].reshape(buf.size, buf.itemsize).all(axis=1)
        missing = np.flatnonzero(~per_element)
        if missing.size:
            found.append(Finding(
                kind=runtime.finding_kinds()["UNWRITTEN_OUTPUT"].text, kernel=name,
                where=p.name,
                element=int(missing[0]), access="write", count=int(missing.size),
                detail=f"{missing.size} of {buf.size} elements unwritten and no init_value",
            ))
    return found


def fault_finding(name: str, fault: KernelFault) -> Finding | None:
    """A fault as a finding, unless the sanitizer stopped the kernel (it reported why)."""
    if isinstance(fault, runtime.SanitizerStop):
        return None
    kinds = {ThreadgroupMemoryError: "threadgroup memory over budget",
             KernelDeadlock: "barrier divergence"}
    kind = next((k for cls, k in kinds.items() if isinstance(fault, cls)), "kernel fault")
    return Finding(kind=kind, kernel=name, detail=fault.detail)
