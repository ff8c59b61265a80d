"""What one step of the editor gave: an `Outcome` (status, the compiler's diagnostics,
the diffs, the timing, the sanitizer's report, the kernel's log) and its one-line
summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..display import TimeUnit
from ..gpu.model import Estimate
from ..kernel_log import KernelLog
from ..oracle import DiffReport
from ..sanitizer import SanitizerReport
from ..timing import Measurement
from .diagnostics import Diagnostic

__all__ = ["Outcome", "Status"]

Status = Literal["compiled", "ok", "ran", "wrong", "unsafe", "compile_error", "fault",
                 "cancelled", "error"]


@dataclass(frozen=True)
class Outcome:
    """What one compile (and run) of the edited texts gave."""

    number: int
    status: Status
    source: str
    header: str
    config: dict[str, Any]
    message: str = ""  # the compiler's text, the fault, or the error
    diagnostics: tuple[Diagnostic, ...] = ()
    diffs: tuple[DiffReport, ...] = ()
    measurement: Measurement | None = None
    sanitizer: SanitizerReport | None = None  # with the sanitizer on
    estimate: Estimate | None = None  # the modelled time of a correct run on the chosen GPU
    seconds: float = 0.0  # wall time of the whole step
    log: KernelLog | None = None  # the kernel's os_log messages in the run (sim)
    header_shift: int = 0  # lines a launch's defines put above the header

    @property
    def ok(self) -> bool:
        """Compiled and ran; and every output matched the oracle, when there is one."""
        return self.status in ("ok", "ran")

    @property
    def compiled(self) -> bool:
        return self.status != "compile_error"

    def summary(self) -> str:
        """One line: status, the diff verdicts, the time and the modelled time."""
        config = ", ".join(f"{k}={v}" for k, v in self.config.items())
        head = f"run #{self.number}: {_STATUS_TEXT[self.status]}"
        if config:
            head += f" [{config}]"
        parts = [head]
        if self.sanitizer is not None:
            found = self.sanitizer.errors
            parts.append(f"sanitizer: {found} finding{'s' if found != 1 else ''}"
                         if found else "sanitizer: clean")
        if self.diffs:
            parts.append("; ".join(
                f"{d.name}: {'PASS' if d.ok else 'FAIL'}"
                + ("" if d.ok else f" {d.n_mismatch}/{d.size} mismatches") for d in self.diffs))
        if self.measurement is not None:
            median = self.measurement.median
            parts.append(f"median {TimeUnit.for_seconds(median).format(median)} "
                         f"[{self.measurement.clock.label}]")
        elif self.message and self.status != "compile_error":
            parts.append(self.message.splitlines()[0])
        if self.estimate is not None:
            e = self.estimate
            parts.append(f"modelled {TimeUnit.for_seconds(e.seconds).format(e.seconds)} on "
                         f"{e.chip}, {e.bound}-bound")
        return " — ".join(parts)


_STATUS_TEXT = {
    "compiled": "compiled",
    "ok": "correct",
    "ran": "ran — no oracle",
    "wrong": "wrong result",
    "unsafe": "sanitizer findings",
    "compile_error": "compile error",
    "fault": "kernel fault",
    "cancelled": "stopped",
    "error": "error",
}
