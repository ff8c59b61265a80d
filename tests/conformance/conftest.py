"""The conformance suite's record of measured agreement, printed as a table at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import mtwork


@dataclass(frozen=True)
class Agreement:
    kernel: str
    source: str
    report: mtwork.DiffReport

    @property
    def summary(self) -> str:
        r = self.report
        verdict = "PASS" if r.ok else f"FAIL ({r.n_mismatch}/{r.size} mismatch)"
        if r.bitwise:
            return f"bitwise {'equal' if r.ok else 'different'}; {verdict}"
        err = "n/a" if r.max_abs_err is None else f"{r.max_abs_err:.3g}"
        ulp = "" if r.max_ulp is None else f", max {r.max_ulp} ulp"
        return f"max abs err {err}{ulp} ({r.dtype}, atol={r.atol:g} rtol={r.rtol:g}); {verdict}"


_RECORDS: list[Agreement] = []


@pytest.fixture
def agreement():
    """`agreement(kernel, source, actual, expected, **diff_options)` measures a kernel's
    output against its project's reference with `mtwork.diff`, prints and records the
    result, and fails the test when it is out of tolerance."""

    def measure(kernel: str, source: str, actual: Any, expected: Any,
                **options: Any) -> mtwork.DiffReport:
        __tracebackhide__ = True
        report = mtwork.diff(actual, expected, name=kernel, **options)
        record = Agreement(kernel, source, report)
        _RECORDS.append(record)
        print(f"{kernel} [{source}]: {record.summary}")
        if not report.ok:
            pytest.fail(f"{kernel} ({source}) disagrees with its reference:\n{report}")
        return report

    return measure


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RECORDS:
        return
    width = max(len(r.kernel) for r in _RECORDS)
    source_width = max(len(r.source) for r in _RECORDS)
    terminalreporter.section("conformance: measured agreement")
    for r in _RECORDS:
        terminalreporter.write_line(
            f"{r.kernel:<{width}}  {r.source:<{source_width}}  {r.summary}"
        )
