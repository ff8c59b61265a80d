"""How mtwork writes numbers, values and tables, in text and in HTML, in one style.

Times use engineering units (``863.4 µs`` beside ``18.85 ms``, never ``1.885e+04 µs``),
four significant digits; other numbers (errors, metrics, figure labels) use `number_text`:
significant digits, plain notation from 0.001 to a million (``0.2524``, ``2230``), short
exponents beyond (``1.53e-8``); parameter values print as a kernel author writes them
(``float16``, ``q8_0``, ``(16, 16, 1)``). `DiffTable` sums up many diffs in one table.
"""

from __future__ import annotations

import html
import inspect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

__all__ = ["DiffTable", "TimeUnit", "bytes_text", "callable_name", "count_text",
           "html_table", "number_text", "percent_text", "seconds_text", "text_table",
           "value_text"]


@dataclass(frozen=True)
class TimeUnit:
    """A unit for times: its name and seconds per unit."""

    name: str
    scale: float

    @classmethod
    def for_seconds(cls, seconds: float) -> TimeUnit:
        """The largest unit in which `seconds` is at least 1 (s, ms, µs, ns)."""
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
            if seconds >= scale:
                return cls(name, scale)
        return cls("ns", 1e-9)

    @classmethod
    def for_all(cls, seconds: Sequence[float]) -> TimeUnit:
        """One unit for a column of times: the one for the smallest."""
        positive = [s for s in seconds if s and s > 0]
        return cls.for_seconds(min(positive)) if positive else cls("s", 1.0)

    def format(self, seconds: float) -> str:
        """`seconds` in this unit with four significant digits; a time this unit would
        show as 1000 or more, or below 1, gets its own unit (``18.85 ms`` in a column of
        µs), so no time is ever written with an exponent."""
        value = seconds / self.scale
        own = TimeUnit.for_seconds(abs(seconds))
        if value and not 1 <= abs(value) < 1000 and own != self:
            return own.format(seconds)
        return f"{number_text(value, 4)} {self.name}"


def seconds_text(seconds: float) -> str:
    """A duration in the unit that gives 1-999: ns, µs, ms or s."""
    return TimeUnit.for_seconds(abs(seconds)).format(seconds)


def number_text(value: float | None, digits: int = 3) -> str:
    """A number to `digits` significant digits: plain from 0.001 up to a million
    (``0.2524``, ``2230``, ``1.5``), else with a short exponent (``1.53e-8``, ``4.2e9``);
    ``0`` for zero, ``n/a`` for None."""
    if value is None:
        return "n/a"
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if -3 <= magnitude < 6:
        rounded = round(value, digits - 1 - magnitude)
        text = f"{rounded:.{max(digits - 1 - magnitude, 0)}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def count_text(value: float) -> str:
    """An integer count with thousands separators; fractional values to 3 significant."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3g}"


def bytes_text(nbytes: float) -> str:
    """Bytes in binary units: 512 B, 4.0 KiB, 128.0 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def percent_text(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def value_text(v: Any) -> str:
    """A parameter value as an author writes it: dtypes by name, strings unquoted."""
    if isinstance(v, mx.Dtype):
        return str(v).rsplit(".", 1)[-1]
    return str(v)


def callable_name(fn: Any) -> str:
    """A function's name, or a lambda's source text."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if name != "<lambda>":
        return name
    try:
        text = inspect.getsource(fn).strip()
    except (OSError, TypeError):
        return name
    start = text.find("lambda")
    return " ".join(text[start:].split())[:80] if start >= 0 else name


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "",
               numeric: bool = False) -> list[str]:
    """Lines of a plain-text table: columns left-aligned, or with `numeric` all but the
    first right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if numeric and i else str(c).ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(cells).rstrip())
    return lines


_CELL = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
_HIGHLIGHT = "#fff3cd"


def html_table(
    *,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    caption: str = "",
    lines: Sequence[str] = (),
    highlighted: Sequence[bool] = (),
    cell_styles: Sequence[Sequence[str]] = (),
    note: str = "",
    numeric: bool = False,
) -> str:
    """A small HTML table: a bold `caption`, plain `lines` under it, the table (rows with
    `highlighted` True on a yellow ground; `cell_styles` adds CSS per cell; with `numeric`
    all but the first column right-aligned) and a `note`. Everything is escaped."""
    head = "".join(f'<th style="{_CELL}">{html.escape(h)}</th>' for h in header)
    body = []
    for r, cells in enumerate(rows):
        style = _CELL + (f";background:{_HIGHLIGHT}" if r < len(highlighted)
                         and highlighted[r] else "")
        extra = list(cell_styles[r]) if r < len(cell_styles) else []
        extra += [""] * (len(cells) - len(extra))
        if numeric:
            extra = [e if i == 0 else ";".join(filter(None, [e, "text-align:right"]))
                     for i, e in enumerate(extra)]
        tds = [f'<td style="{style}{";" + extra[i] if extra[i] else ""}">'
               f"{html.escape(str(c))}</td>" for i, c in enumerate(cells)]
        body.append("<tr>" + "".join(tds) + "</tr>")
    top = f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(caption)}</div>' \
        if caption else ""
    top += "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    foot = f'<div style="font-size:0.85em;color:#555">{html.escape(note)}</div>' if note else ""
    return ('<div style="font-family:sans-serif;font-size:0.9em">'
            f'{top}<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}'
            f"</table>{foot}</div>")


_PASS, _FAIL = "#1a7f37", "#cf222e"


class DiffTable:
    """Many diff reports (`mtwork.diff`'s) as one table, a row each, with every report in
    full folded underneath (HTML `<details>`, open when one failed). `reports` maps a label
    to a report, or is a sequence of reports labelled by their names."""

    header = ("check", "verdict", "max abs err", "max rel err", "max ULP", "mismatches",
              "band")

    def __init__(self, reports: Mapping[str, Any] | Iterable[Any], caption: str = ""):
        items = reports.items() if isinstance(reports, Mapping) else (
            (r.name or f"#{i}", r) for i, r in enumerate(reports))
        self.reports: dict[str, Any] = {str(label): r for label, r in items}
        self.caption = caption

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports.values())

    def _rows(self) -> list[list[str]]:
        return [[label, "PASS" if r.ok else "FAIL", number_text(r.max_abs_err),
                 number_text(r.max_rel_err), "n/a" if r.max_ulp is None else count_text(
                     r.max_ulp), f"{count_text(r.n_mismatch)}/{count_text(r.size)}", r.band]
                for label, r in self.reports.items()]

    def _headline(self) -> str:
        passed = sum(r.ok for r in self.reports.values())
        return (f"{self.caption + ': ' if self.caption else ''}{passed} of "
                f"{len(self.reports)} checks pass")

    def __str__(self) -> str:
        return "\n".join([self._headline(), *text_table(self.header, self._rows())])

    def __repr__(self) -> str:
        return f"<DiffTable {self._headline()}>"

    def _repr_html_(self) -> str:
        rows = self._rows()
        styles = [["", f"color:{_PASS if row[1] == 'PASS' else _FAIL};font-weight:bold"]
                  for row in rows]
        table = html_table(caption=self._headline(), header=self.header, rows=rows,
                           cell_styles=styles)
        reports = "".join(f'<div style="margin:6px 0">{r._repr_html_()}</div>'
                          for r in self.reports.values())
        opened = "" if self.ok else " open"
        return (f"{table}<details{opened}><summary>the {len(self.reports)} reports in full"
                f"</summary>{reports}</details>")
