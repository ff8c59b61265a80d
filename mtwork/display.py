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

__all__ = ["TimeUnit", "callable_name", "html_table", "text_table", "value_text"]


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


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a plain-text table, columns left-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*row).rstrip() for row in rows]


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
) -> str:
    """A small HTML table: a bold `caption`, plain `lines` under it, the table (rows with
    `highlighted` True on a yellow ground; `cell_styles` adds CSS per cell) and a `note`.
    Everything is escaped."""
    head = "".join(f'<th style="{_CELL}">{html.escape(h)}</th>' for h in header)
    body = []
    for r, cells in enumerate(rows):
        style = _CELL + (f";background:{_HIGHLIGHT}" if r < len(highlighted)
                         and highlighted[r] else "")
        extra = cell_styles[r] if r < len(cell_styles) else ()
        tds = [f'<td style="{style}{";" + extra[i] if i < len(extra) and extra[i] else ""}">'
               f"{html.escape(c)}</td>" for i, c in enumerate(cells)]
        body.append("<tr>" + "".join(tds) + "</tr>")
    top = f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(caption)}</div>' \
        if caption else ""
    top += "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    foot = f'<div style="font-size:0.85em;color:#555">{html.escape(note)}</div>' if note else ""
    return ('<div style="font-family:sans-serif;font-size:0.9em">'
            f'{top}<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}'
            f"</table>{foot}</div>")
