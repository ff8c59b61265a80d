"""How mtwork writes numbers, values and tables, in text and in HTML, in one style.

Times use engineering units chosen once per table (``863.4 µs`` beside ``18.85 ms``,
never ``1.885e+04 µs``), four significant digits; parameter values print as a kernel
author writes them (``float16``, ``q8_0``, ``(16, 16, 1)``).
"""

from __future__ import annotations

import html
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

__all__ = ["TimeUnit", "bytes_text", "callable_name", "count_text", "html_table",
           "percent_text", "seconds_text", "text_table", "value_text"]


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
        return f"{seconds / self.scale:.4g} {self.name}"


def seconds_text(seconds: float) -> str:
    """A duration in the unit that gives 1-999: ns, µs, ms or s."""
    return TimeUnit.for_seconds(abs(seconds)).format(seconds)


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
