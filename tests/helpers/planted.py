"""Running planted-bug kernels sanitized, and checking what the sanitizer says of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

import mtwork
from mtwork.sanitizer import SanitizerError, SanitizerReport

N = 64
CALL = dict(grid=(N, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(N,)],
            output_dtypes=[mx.float32])


def sanitize(body: str, *, header: str = "", call: dict | None = None,
             inputs: list | None = None, **options: Any) -> SanitizerReport:
    """Runs body-form kernel `body` (input `inp`: 0..63 as float32 unless `inputs` says,
    output `out`) sanitized; returns the report (empty when nothing was found). `options`
    go to `mtwork.metal_kernel` (`ensure_row_contiguous`, `atomic_outputs`) or, for
    `init_value`, to the call."""
    init_value = options.pop("init_value", None)
    kernel = mtwork.metal_kernel("planted", ["inp"], ["out"], body, header=header, **options)
    args = {**CALL, **(call or {})}
    try:
        kernel(inputs=inputs or [mx.arange(N, dtype=mx.float32)], init_value=init_value,
               sanitize=True, **args)
    except SanitizerError as error:
        return error.report
    return kernel.last_sanitizer_report


@dataclass(frozen=True)
class Planted:
    """A kernel with one known defect, its clean twin, and what must be reported."""

    name: str
    bad: str
    clean: str
    kind: str
    where: str | None = None
    access: str | None = None
    line: str | None = None  # e.g. "source:3"
    header: str = ""
    call: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def run(self, body: str) -> SanitizerReport:
        return sanitize(body, header=self.header, call=self.call, **self.options)


def assert_found(case: Planted) -> mtwork.sanitizer.Finding:
    """The defect is reported with its kind, place and line; returns its finding."""
    report = case.run(case.bad)
    found = report.of_kind(case.kind)
    assert found, f"{case.name}: expected {case.kind}, got:\n{report}"
    first = found[0]
    if case.where is not None:
        assert first.where == case.where, str(report)
    if case.access is not None:
        assert first.access == case.access, str(report)
    if case.line is not None:
        assert first.line == case.line, str(report)
    return first


def assert_clean(case: Planted) -> None:
    report = case.run(case.clean)
    assert report.ok, f"{case.name} (clean twin) was reported:\n{report}"
