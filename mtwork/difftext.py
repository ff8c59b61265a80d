"""How a `DiffReport` reads: its verdict, the metric lines shared by the text and the HTML
renderings, and values printed in their own dtype's precision."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .display import number_text
from .floats import COMPLEX_PART

Scalar = bool | int | float | complex


class Mismatch(Protocol):
    """What is shown of one mismatching element (`oracle.Mismatch`)."""

    index: tuple[int, ...]
    actual: Scalar
    expected: Scalar


class DiffReport(Protocol):
    """What is shown of a comparison (`oracle.DiffReport`; a protocol, so that the
    comparison may use this module without this module using it)."""

    ok: bool
    name: str | None
    dtype: str
    actual_dtype: str
    expected_dtype: str
    shape: tuple[int, ...]
    band: str
    size: int
    n_mismatch: int
    max_abs_err: float | None
    max_rel_err: float | None
    max_ulp: int | None
    mean_ulp: float | None
    cosine: float | None
    nan_actual: int
    nan_expected: int
    inf_actual: int
    inf_expected: int

    @property
    def mismatches(self) -> Sequence[Mismatch]: ...

    @property
    def mismatch_fraction(self) -> float: ...

__all__ = ["headline", "report_html", "report_text"]

_PASS_COLOUR, _FAIL_COLOUR = "#1a7f37", "#cf222e"


def headline(r: DiffReport) -> str:
    """"PASS name" or "FAIL name"."""
    verdict = "PASS" if r.ok else "FAIL"
    return f"{verdict} {r.name}" if r.name else verdict


def _metric_groups(r: DiffReport) -> list[list[tuple[str, str]]]:
    """Label/value pairs shared by the text and HTML renderings, grouped into text lines."""
    sides = (("actual", r.actual_dtype), ("expected", r.expected_dtype))
    others = ", ".join(f"{side} {d}" for side, d in sides if d != r.dtype)
    dtype = f"{r.dtype} ({others})" if others else r.dtype
    pct = f"{100 * r.mismatch_fraction:.3g}%"
    return [
        [("dtype", dtype), ("shape", str(r.shape)), ("band", r.band)],
        [
            ("max abs err", number_text(r.max_abs_err)),
            ("max rel err", number_text(r.max_rel_err)),
            ("ULP max", "n/a" if r.max_ulp is None else str(r.max_ulp)),
            ("ULP mean", number_text(r.mean_ulp)),
            ("cosine", _fmt_float(r.cosine, ".9f")),
        ],
        [
            ("mismatches", f"{r.n_mismatch}/{r.size} ({pct})"),
            ("NaN actual/expected", f"{r.nan_actual}/{r.nan_expected}"),
            ("Inf actual/expected", f"{r.inf_actual}/{r.inf_expected}"),
        ],
    ]


def _fmt_float(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _format_mismatch(r: DiffReport, m: Mismatch) -> str:
    index = "[" + ", ".join(map(str, m.index)) + "]"
    actual = _fmt_value(m.actual, r.actual_dtype)
    expected = _fmt_value(m.expected, r.expected_dtype)
    return f"{index} actual={actual} expected={expected}"


def _fmt_value(value: Scalar, dtype: str) -> str:
    """Shortest text that identifies the value in its own dtype."""
    if isinstance(value, complex):
        part = COMPLEX_PART.get(dtype, "float64")
        real, imag = _fmt_value(value.real, part), _fmt_value(value.imag, part)
        return f"({real}{'' if imag.startswith('-') else '+'}{imag}j)"
    if not isinstance(value, float):
        return str(value)
    if dtype == "bfloat16":
        return f"{value:.4g}"  # 4 significant digits round-trip bfloat16's 8-bit mantissa
    if dtype in ("float16", "float32"):
        return str(np.dtype(dtype).type(value))
    return repr(value)


def report_text(r: DiffReport) -> str:
    """The report as plain text: the verdict, the metric lines, the first mismatches."""
    lines = [headline(r)]
    lines += ["  " + "   ".join(f"{k} {v}" for k, v in group) for group in _metric_groups(r)]
    if r.mismatches:
        lines.append("  first mismatches (row-major):")
        lines += [f"    {_format_mismatch(r, m)}" for m in r.mismatches]
    return "\n".join(lines)


def report_html(r: DiffReport) -> str:
    """The report as an HTML table headed by its verdict."""
    colour = _PASS_COLOUR if r.ok else _FAIL_COLOUR
    cell = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
    rows = [
        f'<tr><th style="{cell}">{html.escape(k)}</th><td style="{cell}">{html.escape(v)}</td></tr>'
        for group in _metric_groups(r)
        for k, v in group
    ]
    if r.mismatches:
        listed = "<br>".join(html.escape(_format_mismatch(r, m)) for m in r.mismatches)
        rows.append(
            f'<tr><th style="{cell}">first mismatches</th>'
            f'<td style="{cell};font-family:monospace">{listed}</td></tr>'
        )
    head = (
        f'<tr><th colspan="2" style="{cell};background:{colour};color:white;font-size:1.1em">'
        f"{html.escape(headline(r))}</th></tr>"
    )
    return (
        '<table style="border-collapse:collapse;font-family:sans-serif;font-size:0.9em">'
        f"{head}{''.join(rows)}</table>"
    )


