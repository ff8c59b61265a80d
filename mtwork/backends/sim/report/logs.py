"""A dispatch's log as the author reads it: the runtime's records (`run.logbuffer`), each
call's place told in the author's files (`places.Places`: ``source:4``, ``header:2``, a
full-source kernel's file, an MLX header), each thread's position in the grid from the
dispatch's geometry; and the threads a fault's message names, whose last messages the
error then quotes."""

from __future__ import annotations

import re

from ....dispatch import Geometry
from ....errors import KernelFault
from ....kernel_log import KernelLog, LogMessage, Triple, with_log
from ....sanitizer import SanitizerError
from ..compile.translation import Translation
from ..run.logbuffer import RawLog, RawMessage
from .places import Places

__all__ = ["kernel_log", "threads_named", "told"]


def _place(places: Places, message: RawMessage,
           known: dict[tuple[str, int], tuple[str, int]]) -> tuple[str, int]:
    key = (message.file, message.line)
    if key not in known:
        place = places.place((message.file, message.line, 0))
        if place is None:  # mtwork's generated lines (none calls os_log)
            known[key] = (message.file, 0)
        else:
            file, _, line = place.text.rpartition(":")
            known[key] = (file, int(line)) if line.isdigit() else (place.text, 0)
    return known[key]


def kernel_log(raw: RawLog, kernel: str, tu: Translation | None, geometry: Geometry,
               note: str = "") -> KernelLog:
    """The `KernelLog` of `raw`, the records of one dispatch of `kernel` compiled as
    `tu` (needed only when there are messages)."""
    if not raw.messages:  # what most dispatches give: nothing to place
        return KernelLog(kernel, (), dropped=raw.dropped, capacity=raw.capacity,
                         truncated=raw.truncated, incomplete=raw.incomplete, note=note)
    if tu is None:
        raise ValueError("placing a log's messages needs the kernel's translation unit")
    places = Places(tu, {})
    known: dict[tuple[str, int], tuple[str, int]] = {}
    # The threadgroup as dispatched: no larger than the grid (run/runtime.py clamps it).
    size = tuple(min(t, g) for t, g in zip(geometry.threadgroup, geometry.grid))
    messages = []
    sx, sy, sz = size
    for m in raw.messages:
        file, line = _place(places, m, known)
        (gx, gy, gz), (tx, ty, tz) = m.group, m.thread
        messages.append(LogMessage(
            m.group, m.thread, (gx * sx + tx, gy * sy + ty, gz * sz + tz), m.index, file,
            line, m.text, m.level, m.subsystem, m.category, m.cut, m.order))
    return KernelLog.of_messages(kernel, messages, dropped=raw.dropped, capacity=raw.capacity,
                                 truncated=raw.truncated, incomplete=raw.incomplete,
                                 note=note)


# How the runtime names a thread (runtime/scheduler.cpp's describe_thread), and how a
# watchdog's report does (run/runtime.py's LiveThread).
_RUNTIME = re.compile(r"thread_position_in_threadgroup \((\d+),(\d+),(\d+)\).*?"
                      r"threadgroup_position_in_grid \((\d+),(\d+),(\d+)\)")
_LIVE = re.compile(r"thread \((\d+), (\d+), (\d+)\) of threadgroup \((\d+), (\d+), (\d+)\)")


def threads_named(text: str) -> list[tuple[Triple, Triple]]:
    """The (threadgroup, thread) pairs a fault's or a watchdog's message names, in order."""
    found: list[tuple[int, tuple[Triple, Triple]]] = []
    for pattern in (_RUNTIME, _LIVE):
        for m in pattern.finditer(text):
            n = [int(v) for v in m.groups()]
            found.append((m.start(), ((n[3], n[4], n[5]), (n[0], n[1], n[2]))))
    return [pair for _, pair in sorted(found)]


def told(fault: KernelFault, log: KernelLog | None) -> BaseException:
    """`fault` with its dispatch's log, its message followed by the last messages of the
    threads it names (a sanitizer's report quotes its findings' own)."""
    named = [] if isinstance(fault, SanitizerError) else threads_named(str(fault))
    return with_log(fault, log, named)
