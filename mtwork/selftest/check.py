"""Running the self-test: the toolchain and the runtime first, then every case on every
backend that can run here, each against its oracle and the backends against each other,
in one table and a summary ready to paste into a bug report."""

from __future__ import annotations

import importlib.metadata
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .. import host
from ..backends import backends as backend_reasons
from ..backends.sim.compile.compiler import runtime_library
from ..display import text_table
from ..oracle import DiffReport, diff
from ..toolchain import clang
from .corpus import Case
from .emulator import emulator_checks

__all__ = ["Report", "Row", "run_cases"]

# What a row says: a backend against the oracle, or two backends against each other.
AGREES, SAME_BITS, WITHIN_BANDS, DIFFERS, ERROR = (
    "agrees", "same bits", "within bands", "DIFFERS", "ERROR")
_FAILED = (DIFFERS, ERROR)


@dataclass(frozen=True)
class Row:
    kernel: str
    backend: str  # a backend's name, or "sim = metal" for two compared
    verdict: str
    error: str  # the largest deviation, or the exception


@dataclass
class Report:
    """The self-test's findings: the checks of the toolchain (what, result, passed), a row
    per case and backend (and per pair of backends), and notes (backends that could not
    run, and why)."""

    checks: list[tuple[str, str, bool]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether anything disagreed or failed (a check, a case, two backends)."""
        return (not self.backends or any(not ok for _, _, ok in self.checks)
                or any(r.verdict in _FAILED for r in self.rows))

    def table(self) -> str:
        return "\n".join(text_table(["kernel", "backend", "verdict", "error"],
                                    [[r.kernel, r.backend, r.verdict, r.error]
                                     for r in self.rows]))

    def summary(self) -> str:
        """What ran, what failed and on which machine: the lines a bug report needs."""
        kernels = len({r.kernel for r in self.rows})
        bad = [r for r in self.rows if r.verdict in _FAILED]
        if self.backends:
            lines = [f"mtwork selftest: {kernels} kernel{'s' if kernels != 1 else ''} on "
                     f"{', '.join(self.backends)}; "
                     f"{len(bad)} disagreement{'s' if len(bad) != 1 else ''} or errors"]
        else:
            lines = ["mtwork selftest: no backend could run here"]
        lines += [f"  {r.kernel} on {r.backend}: {r.verdict}: {r.error}" for r in bad]
        lines += [f"  check failed: {what}: {result}" for what, result, ok in self.checks
                  if not ok]
        lines += [f"machine: {host.describe()}", f"versions: {_versions()}"]
        lines += self.notes
        return "\n".join(lines)

    def __str__(self) -> str:
        checks = [f"{'ok  ' if ok else 'FAIL'} {what}: {result}"
                  for what, result, ok in self.checks]
        return "\n".join([*checks, "", self.table(), "", self.summary()])


def _versions() -> str:
    found = []
    for package in ("mtwork", "mlx", "ziglang", "numpy"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} (not installed)")
    return ", ".join(found)


def _check(what: str, probe: Callable[[], str]) -> tuple[str, str, bool]:
    try:
        return what, probe(), True
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        return what, f"{type(exc).__name__}: {exc}", False


def _zig_version() -> str:
    command = clang()
    done = subprocess.run([command[0], "version"], capture_output=True, text=True, timeout=60)
    return f"zig {done.stdout.strip()} ({command[0]})"


def _metal_device() -> str:
    info = mx.metal.device_info()
    return f"{info.get('device_name', 'a Metal device')} ({info.get('architecture', '?')})"


def toolchain_checks(run_on: Sequence[str]) -> list[tuple[str, str, bool]]:
    """The toolchain and runtime the emulator needs, the emulator's fault isolation,
    sanitizer and profiler when `sim` runs, and the Metal device when `metal` runs."""
    checks = [_check("clang (ziglang)", _zig_version),
              _check("emulator runtime", lambda: f"built: {runtime_library().name}")]
    if "sim" in run_on:
        checks += emulator_checks(_check)
    if "metal" in run_on:
        checks.append(_check("Metal device", _metal_device))
    return checks


def _same_dtype(expected: Any, like: Any) -> Any:
    """`expected` in `like`'s dtype (an exact case's oracle holds exact values)."""
    if isinstance(like, mx.array):
        return mx.array(expected).astype(like.dtype) if not isinstance(
            expected, mx.array) else expected.astype(like.dtype)
    return np.asarray(expected).astype(np.asarray(like).dtype)


def _deviation(report: DiffReport) -> str:
    if report.bitwise:
        return "0" if report.ok else f"{report.n_mismatch}/{report.size} elements differ"
    parts = [f"max |err| {report.max_abs_err:.3g}" if report.max_abs_err is not None else ""]
    if report.max_ulp is not None:
        parts.append(f"{report.max_ulp} ULP")
    if not report.ok:
        parts.append(f"{report.n_mismatch}/{report.size} outside {report.band}")
    return ", ".join(p for p in parts if p)


def _compare(case: Case, got: Sequence[Any], want: Sequence[Any], *,
             against_oracle: bool) -> tuple[bool, str]:
    if len(got) != len(want):
        return False, f"{len(got)} outputs, expected {len(want)}"
    reports = []
    for a, e in zip(got, want):
        if case.exact:
            reports.append(diff(a, _same_dtype(e, a), bitwise=True))
        else:
            reports.append(diff(a, e, **(case.diff_options if against_oracle else {})))
    worst = max(reports, key=lambda r: (not r.ok, r.max_abs_err or 0.0))
    return all(r.ok for r in reports), _deviation(worst)


def _run_one(case: Case, backend: str) -> tuple[list[Any] | None, Row | None]:
    try:
        outputs = [o for o in case.run(backend)]
        mx.eval([o for o in outputs if isinstance(o, mx.array)])
        return outputs, None
    except Exception as exc:  # noqa: BLE001 - a case that fails is a finding
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, Row(case.name, backend, ERROR, f"{type(exc).__name__}: {first}"[:200])


def run_cases(cases: Sequence[Case], run_on: Sequence[str]) -> list[Row]:
    """Each case on each backend against its oracle, then the first backend against each
    other one (bit for bit for an exact case)."""
    rows: list[Row] = []
    for case in cases:
        try:
            expected = list(case.expected())
        except Exception as exc:  # noqa: BLE001 - a broken oracle is a finding too
            rows.append(Row(case.name, "oracle", ERROR, f"{type(exc).__name__}: {exc}"))
            continue
        outputs: dict[str, list[Any]] = {}
        for backend in run_on:
            got, failed = _run_one(case, backend)
            if failed is not None:
                rows.append(failed)
                continue
            outputs[backend] = got  # type: ignore[assignment]
            ok, error = _compare(case, got, expected, against_oracle=True)  # type: ignore
            rows.append(Row(case.name, backend, AGREES if ok else DIFFERS, error))
        ran = list(outputs)
        for other in ran[1:]:
            ok, error = _compare(case, outputs[other], outputs[ran[0]], against_oracle=False)
            verdict = (SAME_BITS if case.exact else WITHIN_BANDS) if ok else DIFFERS
            rows.append(Row(case.name, f"{ran[0]} = {other}", verdict, error))
    return rows


def usable_backends(wanted: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The backends to run (`wanted`, else every registered one) that can run here, and a
    note for each that cannot, with the reason."""
    reasons = backend_reasons()
    chosen = list(wanted) if wanted else list(reasons)
    unknown = [b for b in chosen if b not in reasons]
    if unknown:
        raise ValueError(f"unknown backend {unknown[0]!r}: choose from {', '.join(reasons)}")
    run_on = [b for b in chosen if reasons[b] is None]
    notes = [f"{b}: not run: {reasons[b]}" for b in chosen if reasons[b] is not None]
    return run_on, notes
