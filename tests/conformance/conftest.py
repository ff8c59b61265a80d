"""The conformance suite's record of measured agreement: each `agreement` call writes a
row (`report.record`) and the rows are printed as a table at the end.

Every kernel the suite compiles passes the Metal front end with every file it includes
held to the rules, MLX's headers too (`frontend.checking_every_file`): the corpora compile
on Apple's compiler, so a rule that refuses any of them is wrong, and fails here."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest

import mtwork
from mtwork.backends.sim.compile import frontend

from .report import record


@pytest.fixture(autouse=True)
def _every_file_held_to_the_metal_rules():
    with frontend.checking_every_file():
        yield


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


@cache
def source_text(package: str) -> str:
    """A package with its installed version, e.g. "mlx 0.32.4"."""
    try:
        return f"{package} {version(package)}"
    except PackageNotFoundError:
        return package


@pytest.fixture
def agreement():
    """`agreement(kernel, source, actual, expected, reference=..., compile_s=...,
    **diff_options)` measures a kernel's output against its project's reference with
    `mtwork.diff`, prints it, records a conformance row (suite: the package the kernel
    came from, `source`'s first word; `source` may add its version) and fails the test
    when it is out of tolerance."""

    def measure(kernel: str, source: str, actual: Any, expected: Any, *,
                reference: str = "", compile_s: float | None = None,
                **options: Any) -> mtwork.DiffReport:
        __tracebackhide__ = True
        report = mtwork.diff(actual, expected, name=kernel, **options)
        entry = Agreement(kernel, source, report)
        _RECORDS.append(entry)
        print(f"{kernel} [{source}]: {entry.summary}")
        record(suite=source.split()[0], kernel=kernel, source=source_text(source),
               reference=reference, agreement=report, compile_s=compile_s,
               status="pass" if report.ok else "fail")
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
