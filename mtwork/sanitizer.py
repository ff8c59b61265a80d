"""Sanitizer reports: what the emulator's sanitizer mode found in a kernel run.

`kernel(..., sanitize=True)` (or `MTWORK_SANITIZE=1`) runs the kernel on `sim` with every
load and store checked (anchors: NVIDIA compute-sanitizer's memcheck, racecheck, synccheck
and initcheck; Oclgrind; Metal shader validation):

- out-of-bounds reads and writes of device buffers (loads, stores, copies and fills,
  vectors that run past the end, atomics; a strided view is bounded by the memory its
  elements span), and writes to inputs;
- array subscripts outside the array, where the compiler knows its size: thread-private
  arrays, their rows, array members of structs, threadgroup arrays;
- threadgroup-memory races: two threads touching the same element between two barriers,
  at least one writing, not through atomics (lanes of one SIMD-group are ordered only by
  a SIMD-group function or `simdgroup_barrier` between them);
- barrier divergence and SIMD divergence, and SIMD-group functions that read an inactive
  lane (one that returned, waits elsewhere, or is past the end of a partial SIMD-group:
  Metal leaves the result undefined);
- reads of threadgroup memory never written, and outputs never written when no
  `init_value` was given;
- threadgroup memory over 32 KiB (more than 1024 threads per threadgroup is refused with a
  ValueError before the kernel runs, sanitized or not).

Each finding names the author's line; in a helper (the author's header, MLX's headers)
also the author's call of it. Not checked: accesses through `volatile` pointers, atomic
loads and stores (the read-modify-writes are), subscripts of arrays through pointers.

`sanitize=True` raises `SanitizerError` when anything is found; `sanitize="warn"` warns
and returns the outputs; `sanitize="report"` only returns them (a tool shows the report).
Each way the report is kept on the kernel as `last_sanitizer_report`.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

from .errors import KernelFault


@dataclass(frozen=True)
class Finding:
    """One kind of defect at one place in the kernel (repeats are counted, not listed)."""

    kind: str
    kernel: str
    where: str = ""            # buffer or threadgroup array name
    element: int | None = None
    access: str = ""           # "read" / "write"
    thread: tuple[int, int, int] | None = None
    other_thread: tuple[int, int, int] | None = None
    other_access: str = ""
    threadgroup: tuple[int, int, int] | None = None
    line: str = ""             # e.g. "source:7", "header:3"
    called_from: str = ""      # the author's call of the helper `line` is in, e.g. "source:7"
    count: int = 1
    detail: str = ""
    messages: tuple[str, ...] = ()  # the last messages its threads logged (os_log)

    def __str__(self) -> str:
        parts = [f"{self.kind} in kernel `{self.kernel}`"]
        if self.where:
            at = f" element {self.element}" if self.element is not None else ""
            parts.append(f"{self.access + ' of ' if self.access else ''}`{self.where}`{at}")
        if self.thread is not None:
            who = f"thread {self.thread}"
            if self.threadgroup is not None:
                who += f" of threadgroup {self.threadgroup}"
            parts.append(who)
        if self.other_thread is not None and self.other_thread != self.thread:
            parts.append(f"and thread {self.other_thread} ({self.other_access or 'access'})")
        if self.line:
            call = f" (called from {self.called_from})" if self.called_from else ""
            parts.append(f"at {self.line}{call}")
        if self.count > 1:
            parts.append(f"({self.count} times)")
        if self.detail:
            parts.append(self.detail)
        return "\n     ".join([", ".join(parts), *self.messages])


@dataclass
class SanitizerReport:
    kernel: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return len(self.findings)

    @property
    def ok(self) -> bool:
        return not self.findings

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def __str__(self) -> str:
        lines = [f"SANITIZER: kernel `{self.kernel}`"]
        lines += [f"  {i + 1}. {f}" for i, f in enumerate(self.findings)]
        lines.append(f"SANITIZER SUMMARY: {self.errors} error{'s' if self.errors != 1 else ''}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.ok else "#cf222e"
        rows = "".join(f"<li>{html.escape(str(f))}</li>" for f in self.findings)
        return (f"<div><b style='color:{colour}'>Sanitizer: {self.errors} error(s)</b> in "
                f"<code>{html.escape(self.kernel)}</code><ol>{rows}</ol></div>")


class SanitizerWarning(UserWarning):
    """Findings of a run with sanitize='warn'."""


class SanitizerError(KernelFault):
    """The sanitizer found defects; `report` lists them."""

    def __init__(self, report: SanitizerReport):
        self.report = report
        self.kernel = report.kernel
        self.detail = str(report)
        Exception.__init__(self, str(report))

    def __reduce__(self):
        return type(self), (self.report,)


_OFF = ("0", "", "off", "false", "no")
_ON = ("1", "raise", "on", "true", "yes")


def mode(sanitize: bool | str | None) -> str | None:
    """None (off), "raise", "warn" or "report", from the call argument or
    $MTWORK_SANITIZE."""
    if sanitize is None:
        value = os.environ.get("MTWORK_SANITIZE", "").strip().lower()
        if value in _OFF:
            return None
        if value in _ON or value == "warn":
            return "warn" if value == "warn" else "raise"
        raise ValueError(f"MTWORK_SANITIZE must be 1 (raise), warn or 0 (off), got "
                         f"{os.environ['MTWORK_SANITIZE']!r}")
    if sanitize is False:
        return None
    if sanitize is True or sanitize == "raise":
        return "raise"
    if sanitize in ("warn", "report"):
        return sanitize  # type: ignore[return-value]
    raise ValueError(f"`sanitize` must be True, False, 'warn' or 'report', got {sanitize!r}")
