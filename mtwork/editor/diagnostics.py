"""Compiler messages and sanitizer findings as editor diagnostics: `source:LINE:COL:
error: ...` lines of a `CompileError` message, and findings at their lines, located in the
author's own files (the kernel body, the header; a full-source kernel's library file is
its ``source``)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..sanitizer import SanitizerReport

File = Literal["source", "header"]
Severity = Literal["error", "warning", "note"]

_DIAGNOSTIC = re.compile(
    r"^(?P<file>source|header):(?P<line>\d+):(?P<col>\d+): "
    r"(?P<severity>fatal error|error|warning|note): (?P<message>.*)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message at a place in the body (`source`) or the header; 1-based."""

    file: File
    line: int
    col: int
    severity: Severity
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.message}"


def parse_diagnostics(message: str, *, header_shift: int = 0) -> list[Diagnostic]:
    """The located messages of a compiler's text, in order. `header_shift` is the number of
    lines put in front of the author's header (a Launch's `#define`s), subtracted from
    header lines; a message that lands in those lines is put on line 1."""
    found = []
    for m in _DIAGNOSTIC.finditer(message):
        line = int(m["line"])
        if m["file"] == "header":
            line = max(1, line - header_shift)
        severity = "error" if m["severity"] == "fatal error" else m["severity"]
        found.append(Diagnostic(m["file"], line, int(m["col"]), severity, m["message"]))
    return found


def editor_place(file: str, line: int, library: Path | None, header_shift: int = 0
                 ) -> tuple[File, int] | None:
    """Where `file`'s `line` (as a kernel's log or report names it) is in the edited
    texts: the body (``source``, or a full-source kernel's `library` file) or the header
    (less the `header_shift` lines a launch's defines put above it); None elsewhere."""
    if line <= 0:
        return None
    if file == "header":
        return "header", max(1, line - header_shift)
    if file == "source" or (library is not None and Path(file).name == library.name):
        return "source", line
    return None


_FINDING_LINE = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+)")


def finding_diagnostics(report: SanitizerReport, library: Path | None) -> list[Diagnostic]:
    """The sanitizer's findings at their lines in the edited texts (`library`: the file a
    full-source kernel's ``source`` is); findings without a line are left to the report."""
    found = []
    for finding in report.findings:
        m = _FINDING_LINE.match(finding.line)
        if m is None:
            continue
        file = m["file"]
        if file not in ("source", "header"):
            if library is None or file != library.name:
                continue
            file = "source"
        found.append(Diagnostic(file, int(m["line"]), 1, "error",  # type: ignore[arg-type]
                                f"sanitizer: {finding}"))
    return found
