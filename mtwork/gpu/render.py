"""Plain-text and HTML tables for counters and estimates, with readable units."""

from __future__ import annotations

import html
from collections.abc import Sequence

Row = Sequence[str]


def count(value: float) -> str:
    """An integer count with thousands separators; fractional values to 3 significant."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3g}"


def size(nbytes: float) -> str:
    """Bytes in binary units: 512 B, 4.0 KiB, 128.0 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def seconds(value: float) -> str:
    """A duration in the unit that gives 1-999: ns, µs, ms or s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def text_table(header: Row, rows: Sequence[Row], indent: str = "  ",
               left: Sequence[int] = (0,)) -> list[str]:
    """Columns padded to their widest cell; the `left` columns left-aligned, others right."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) if i in left else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(cells).rstrip())
    return lines


def html_table(caption: str, header: Row, rows: Sequence[Row], note: str = "") -> str:
    head = "".join(f"<th style='text-align:right;padding:2px 8px'>{html.escape(h)}</th>"
                   for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'};"
                         f"padding:2px 8px'>{html.escape(str(c))}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows)
    foot = f"<div style='font-size:90%;color:#555'>{html.escape(note)}</div>" if note else ""
    return (f"<div><table style='border-collapse:collapse'><caption style='text-align:left;"
            f"font-weight:bold'>{html.escape(caption)}</caption><tr>{head}</tr>{body}"
            f"</table>{foot}</div>")
