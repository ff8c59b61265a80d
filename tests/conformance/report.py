"""The conformance record: one row per third-party kernel a test runs, and the page made
from the rows.

A test records what it measured with `record` (or `record_unsupported` for a kernel that
stops with an error); rows are appended as JSON lines to ``out/conformance/<suite>.jsonl``
(``$MTWORK_CONFORMANCE_DIR`` overrides the folder). Runs add up: the page keeps the latest
row of each kernel (by source and name, whichever suite name it was recorded under), so
the default run and the slow one together give the whole table.
``python -m tests.conformance.report`` renders the record, ``docs/records/conformance.md``
(the guide to the suite is ``docs/conformance.md``): a table per suite, then what is
still unsupported, each with the error a user gets.

    from tests.conformance.report import record
    record(suite="mlx", kernel="softmax_looped<float32>", source="mlx 0.32.4",
           reference="mx.softmax (CPU)", agreement=diff_report, compile_s=0.9,
           status="pass")
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import mtwork

__all__ = ["Row", "agreement_of", "read_rows", "record", "record_unsupported", "render"]

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "records"  # the guide, docs/conformance.md, is written by hand
STATUSES = ("pass", "fail", "unsupported")


def rows_dir() -> Path:
    """Where rows are written: ``$MTWORK_CONFORMANCE_DIR`` or ``out/conformance/``."""
    return Path(os.environ.get("MTWORK_CONFORMANCE_DIR") or ROOT / "out" / "conformance")


@dataclass(frozen=True)
class Row:
    """One kernel's measured conformance."""

    suite: str  # the corpus: "mlx", "mlx-lm", "llama.cpp", ...
    kernel: str  # the kernel as the suite names it, with its template arguments or variant
    source: str  # the package and version it was read from, e.g. "mlx 0.32.4"
    reference: str  # what it was compared with, e.g. "mx.cumsum (CPU)"
    bitwise: bool | None  # compared bit for bit (None: not compared)
    max_abs: float | None  # the largest absolute error (None: bitwise or not compared)
    max_ulp: int | None  # the largest distance in ULPs of the output's dtype
    tolerance: str  # the band it was judged by ("" for bitwise)
    compile_s: float | None  # seconds to compile the kernel in this run (None: not timed)
    status: str  # "pass", "fail" or "unsupported"
    error: str = ""  # for an unsupported kernel: the first line of the error a user gets
    recorded: float = 0.0  # when (seconds since the epoch)
    agreement_text: str = ""  # a row that gives its agreement as text, not as the fields

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Row:
        """A row as `record` writes it, or in the shorter shape that states its agreement
        as one text (``"agreement": "bitwise"``) and leaves out the fields."""
        data = dict(data)
        if "agreement" in data:
            data["agreement_text"] = str(data.pop("agreement"))
            for field in ("bitwise", "max_abs", "max_ulp"):
                data.setdefault(field, None)
            data.setdefault("tolerance", "")
        return cls(**data)

    @property
    def agreement(self) -> str:
        """The agreement as one cell: "bitwise", or the largest errors."""
        if self.status == "unsupported":
            return "—"
        if self.agreement_text:
            return self.agreement_text
        if self.bitwise:
            return "bitwise"
        parts = []
        if self.max_abs is not None:
            parts.append(f"max abs {self.max_abs:.2g}")
        if self.max_ulp is not None:
            parts.append(f"{self.max_ulp} ulp")
        return ", ".join(parts) or "—"


def agreement_of(report: mtwork.DiffReport | Mapping[str, Any] | None) -> dict[str, Any]:
    """The agreement fields of a row from a `mtwork.DiffReport` (or a mapping with the
    keys ``bitwise``, ``max_abs``, ``max_ulp``, ``tolerance``)."""
    if report is None:
        return {"bitwise": None, "max_abs": None, "max_ulp": None, "tolerance": ""}
    if isinstance(report, Mapping):
        return {"bitwise": report.get("bitwise"), "max_abs": report.get("max_abs"),
                "max_ulp": report.get("max_ulp"), "tolerance": report.get("tolerance", "")}
    return {
        "bitwise": bool(report.bitwise),
        "max_abs": None if report.max_abs_err is None else float(report.max_abs_err),
        "max_ulp": None if report.max_ulp is None else int(report.max_ulp),
        "tolerance": "" if report.bitwise
        else f"{report.dtype}: atol {report.atol:g}, rtol {report.rtol:g}",
    }


def record(*, suite: str, kernel: str, source: str, reference: str,
           agreement: mtwork.DiffReport | Mapping[str, Any] | None,
           compile_s: float | None = None, status: str, error: str = "") -> Row:
    """Appends one row to ``<rows_dir>/<suite>.jsonl`` and returns it. `agreement` is the
    kernel's `mtwork.DiffReport` against its reference (or the same fields as a mapping,
    or None when nothing ran); `status` is "pass", "fail" or "unsupported"."""
    if status not in STATUSES:
        raise ValueError(f"`status` must be one of {', '.join(STATUSES)}, got {status!r}")
    if not re.fullmatch(r"[\w.+-]+", suite):
        raise ValueError(f"`suite` names a file: letters, digits, '.', '+', '-'; got {suite!r}")
    row = Row(suite=suite, kernel=kernel, source=source, reference=reference,
              **agreement_of(agreement), compile_s=compile_s, status=status,
              error=_first_error(error), recorded=time.time())
    folder = rows_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{suite}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(row)) + "\n")  # one write per row: lines stay whole
    return row


def _first_error(message: str) -> str:
    """An error as one line: its first, and the first compiler diagnostic under it (a
    `CompileError` says which kernel on its first line and what went wrong below)."""
    lines = message.strip().splitlines()
    if not lines:
        return ""
    detail = next((line.split("error:", 1)[1].strip() for line in lines[1:]
                   if "error:" in line), "")
    detail = re.sub(r"\s*\[-W[\w#=-]*\]$", "", detail)  # clang's name of the diagnostic
    return f"{lines[0]} {detail}" if detail else lines[0]


def record_unsupported(*, suite: str, kernel: str, source: str, error: BaseException | str,
                       reference: str = "") -> Row:
    """Records a kernel that stops with an error, and the error's first line."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return record(suite=suite, kernel=kernel, source=source, reference=reference,
                  agreement=None, status="unsupported", error=message)


def read_rows(folder: Path | None = None) -> list[Row]:
    """The latest row of each kernel (by its source and name) among the JSON-lines files
    in `folder`: a kernel recorded under two suite names is listed once, with the
    reference and compile time of an earlier row where the latest leaves them out."""
    latest: dict[tuple[str, str], Row] = {}
    for path in sorted((folder or rows_dir()).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = Row.from_json(json.loads(line))
                key = (row.source, row.kernel)
                earlier = latest.get(key)
                if earlier is None:
                    latest[key] = row
                elif earlier.recorded <= row.recorded:
                    latest[key] = _filled(row, earlier)
                else:
                    latest[key] = _filled(earlier, row)
    return sorted(latest.values(), key=lambda r: (r.suite, r.kernel))


def _filled(row: Row, other: Row) -> Row:
    """`row` with the reference and compile time it leaves empty taken from `other` (a
    suite may record one kernel twice, once with those and once without)."""
    return replace(row, reference=row.reference or other.reference,
                   compile_s=other.compile_s if row.compile_s is None else row.compile_s)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """`text` as inline code (a double-backtick span when it holds backticks)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _suite_table(rows: list[Row]) -> list[str]:
    lines = ["| kernel | source | reference | agreement | tolerance | compile | status |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(c) for c in (
            r.kernel, r.source, r.reference, r.agreement, r.tolerance or "—",
            _seconds(r.compile_s), r.status)) + " |")
    return lines


def render(rows: Iterable[Row], *, preamble: str = "") -> str:
    """The conformance page: a table per suite, then the unsupported kernels."""
    rows = list(rows)
    out = ["# Conformance record: other projects' kernels on `sim`", ""]
    if preamble:
        out += [preamble.strip(), ""]
    for suite in sorted({r.suite for r in rows}):
        ran = [r for r in rows if r.suite == suite and r.status != "unsupported"]
        if not ran:
            continue
        passed = sum(r.status == "pass" for r in ran)
        out += [f"## {suite}", "", f"{passed} of {len(ran)} kernels agree with their "
                f"reference.", "", *_suite_table(ran), ""]
    unsupported = [r for r in rows if r.status == "unsupported"]
    if unsupported:
        out += ["## Still unsupported", "", "| suite | kernel | source | the error a user gets |",
                "| --- | --- | --- | --- |"]
        out += ["| " + " | ".join(_cell(c) for c in (r.suite, r.kernel, r.source,
                                                      _code(r.error))) + " |"
                for r in unsupported]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Render docs/records/conformance.md from "
                                                 "the rows the conformance tests recorded.")
    parser.add_argument("--rows", type=Path, default=None, help="folder of *.jsonl rows "
                        "(default: $MTWORK_CONFORMANCE_DIR or out/conformance)")
    parser.add_argument("--preamble", type=Path, default=RECORDS / "conformance.intro.md",
                        help="Markdown put under the title "
                             "(default: docs/records/conformance.intro.md)")
    parser.add_argument("-o", "--output", type=Path, default=RECORDS / "conformance.md")
    args = parser.parse_args(argv)
    rows = read_rows(args.rows)
    if not rows:
        raise SystemExit(f"no conformance rows in {args.rows or rows_dir()}: run "
                         f"`python -m pytest tests/conformance` first")
    preamble = args.preamble.read_text() if args.preamble.is_file() else ""
    args.output.write_text(render(rows, preamble=preamble))
    print(f"wrote {args.output} ({len(rows)} kernels)")


if __name__ == "__main__":
    main()
