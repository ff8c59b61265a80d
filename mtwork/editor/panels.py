"""HTML for what the editor shows beside the code: the compiler's errors, the last result
(diffs against the oracle, the kernel's log beside them, and the timing), and a static copy
of the whole editor, with the source and its line numbers, for notebooks exported to HTML
(no JavaScript needed). A log message's row names the editor (`uid`) and the line it was
written at: the code editor moves to that line when the row is clicked
(js/editor_src.js)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from ..display import count_text
from .diagnostics import Diagnostic, editor_place
from .loop import EditLoop
from .outcome import Outcome

_FAIL = "#cf222e"
_PASS = "#1a7f37"
_MUTED = "#57606a"
_BOX = "font-family:sans-serif;font-size:0.9em;margin:4px 0"
_PRE = ("font-family:monospace;font-size:12px;white-space:pre-wrap;margin:4px 0;"
        "padding:6px;border-radius:3px")


def status_text(loop: EditLoop) -> tuple[str, str]:
    """(kind, text) for the status line: kind is "busy" or the last outcome's status."""
    if loop.phase != "idle":
        return "busy", f"{loop.phase}…"
    if loop.last is None:
        return "idle", "not run yet: Ctrl/Cmd-Enter or Run compiles and runs"
    return loop.last.status, loop.last.summary()


def errors_html(outcome: Outcome | None, *, library: Path | None = None, uid: str = "") -> str:
    """The compiler's text (or the fault, or the error) of a failed step, with the log of
    a kernel that faulted; "" otherwise."""
    if outcome is None or outcome.status in ("ok", "ran", "compiled", "wrong", "unsafe"):
        return ""
    title = {"compile_error": "Compile error", "fault": "Kernel fault",
             "cancelled": "Stopped"}.get(outcome.status, "Error")
    return (
        f'<div class="mtw-editor-errors" style="{_BOX}">'
        f'<div style="color:{_FAIL};font-weight:bold">{title} (run #{outcome.number})</div>'
        f'<pre style="{_PRE};background:#fff1f0;color:#1f2328">'
        f"{html.escape(outcome.message)}</pre>{log_html(outcome, library, uid)}</div>"
    )


LOG_ROWS = 200  # messages the panel lists


def log_html(outcome: Outcome, library: Path | None = None, uid: str = "") -> str:
    """The kernel's log of `outcome`'s run: its summary and its first messages, each row
    taking the editor with `uid` to the message's line when clicked; "" without one."""
    log = outcome.log
    if log is None or not (log.messages or log.dropped):
        return ""
    rows = []
    for m in log.messages[:LOG_ROWS]:
        place = editor_place(m.file, m.line, library, outcome.header_shift)
        target = (f' data-mtw-uid="{html.escape(uid)}" data-mtw-file="{place[0]}" '
                  f'data-mtw-line="{place[1]}" title="go to {place[0]} line {place[1]}" '
                  f'style="cursor:pointer"' if place else "")
        level = "" if m.level == "default" else f"[{m.level}] "
        cells = (f"({m.threadgroup[0]},{m.threadgroup[1]},{m.threadgroup[2]})",
                 f"({m.thread[0]},{m.thread[1]},{m.thread[2]})", str(m.lane), m.place,
                 level + m.text)
        rows.append(f'<tr class="mtw-log-row"{target}>'
                    + "".join(f'<td style="{_LOG_CELL}">{html.escape(c)}</td>' for c in cells)
                    + "</tr>")
    rest = len(log) - min(len(log), LOG_ROWS)
    more = (f'<div style="color:{_MUTED}">… and {count_text(rest)} more: '
            f"editor.last.log has them all</div>" if rest else "")
    head = "".join(f'<th style="{_LOG_CELL}">{h}</th>' for h in log.HEADER)
    return (f'<div class="mtw-editor-log" style="{_BOX}">'
            f'<div style="font-weight:bold">{html.escape(log.summary())}</div>'
            f'<div style="max-height:260px;overflow:auto"><table style="border-collapse:'
            f'collapse;font-size:12px"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table></div>{more}</div>")


_LOG_CELL = ("padding:1px 6px;text-align:left;border-bottom:1px solid #eaeef2;"
             "font-family:monospace;white-space:pre")


def result_html(loop: EditLoop, *, fold_passing: bool = False, uid: str = "") -> str:
    """The diffs, the kernel's log beside them, and the timing of the last run that
    compiled and ran (a wrong result is shown too, it is the news), marked as earlier when
    newer runs failed or are running. `fold_passing` folds the diff tables of a passing run
    (the summary line says PASS); `uid` names the editor a log row's click moves."""
    shown = _last_shown(loop)
    if shown is None:
        return (f'<div class="mtw-editor-result" style="{_BOX};color:{_MUTED}">'
                "No result yet.</div>")
    notes = []
    if loop.last is not None and loop.last is not shown:
        notes.append(f"run #{loop.last.number} failed ({loop.last.status.replace('_', ' ')}): "
                     f"showing run #{shown.number}, the last one with a result")
    if loop.phase != "idle":
        notes.append(f"{loop.phase}… (showing run #{shown.number} meanwhile)")
    colour = _PASS if shown.ok else _FAIL
    parts = [
        f'<div class="mtw-editor-result" data-run="{shown.number}" '
        f'data-status="{shown.status}" style="{_BOX}">',
        f'<div class="mtw-editor-summary" style="font-weight:bold;color:{colour}">'
        f"{html.escape(shown.summary())}</div>",
    ]
    parts += [f'<div style="color:{_MUTED}">{html.escape(n)}</div>' for n in notes]
    if shown.message and not shown.diffs:
        parts.append(f'<pre style="{_PRE}">{html.escape(shown.message)}</pre>')
    if shown.sanitizer is not None and not shown.sanitizer.ok:
        parts.append(f'<div class="mtw-editor-sanitizer">{shown.sanitizer._repr_html_()}</div>')
    beside = []
    if shown.diffs:
        opened = "" if fold_passing and shown.ok else " open"
        beside.append(f"<details{opened}><summary>diffs against the oracle</summary>"
                      '<div style="display:flex;flex-wrap:wrap;gap:12px;margin-top:4px">'
                      + "".join(f"<div>{d._repr_html_()}</div>" for d in shown.diffs)
                      + "</div></details>")
    logged = log_html(shown, loop.target.files.get("source"), uid)
    if logged:
        beside.append(logged)
    if beside:
        parts.append('<div style="display:flex;flex-wrap:wrap;gap:16px;align-items:'
                     'flex-start">' + "".join(f"<div>{b}</div>" for b in beside) + "</div>")
    if shown.measurement is not None:
        parts.append(f'<div style="margin-top:4px">{shown.measurement._repr_html_()}</div>')
    if shown.estimate is not None:
        parts.append(f"<details><summary>modelled on {html.escape(shown.estimate.chip)}: "
                     f"{html.escape(shown.estimate.bound)}-bound (a model, not a measurement)"
                     f"</summary>{shown.estimate._repr_html_()}</details>")
    parts.append("</div>")
    return "".join(parts)


def _last_shown(loop: EditLoop) -> Outcome | None:
    """The newest outcome that ran: the last one if it did, else the last good one."""
    last = loop.last
    if last is not None and last.status in ("ok", "ran", "wrong", "unsafe"):
        return last
    return loop.last_good


def code_html(text: str, diagnostics: Sequence[Diagnostic] = (), *, title: str = "") -> str:
    """`text` with line numbers; lines with errors are marked, their messages below them."""
    by_line: dict[int, list[Diagnostic]] = {}
    for d in diagnostics:
        by_line.setdefault(d.line, []).append(d)
    rows = []
    lines = text.split("\n")
    width = len(str(len(lines)))
    for number, line in enumerate(lines, start=1):
        found = by_line.get(number, [])
        error = any(d.severity == "error" for d in found)
        style = "background:#ffebe9" if error else ""
        rows.append(
            f'<div class="mtw-line" data-line="{number}" style="{style}">'
            f'<span style="color:{_MUTED};user-select:none">{str(number).rjust(width)}  </span>'
            f"{html.escape(line) or ' '}</div>"
        )
        for d in found:
            colour = _FAIL if d.severity == "error" else _MUTED
            rows.append(f'<div style="color:{colour};padding-left:{width + 2}ch">'
                        f"^ {html.escape(d.severity)}: {html.escape(d.message)}</div>")
    head = (f'<div style="font-weight:bold;margin-top:6px">{html.escape(title)}</div>'
            if title else "")
    return (f'{head}<div class="mtw-code" style="{_PRE};white-space:pre;overflow-x:auto;'
            f'border:1px solid #d0d7de">{"".join(rows)}</div>')


def snapshot_html(loop: EditLoop, uid: str = "") -> str:
    """The editor as static HTML: status, the texts with line numbers and errors, the
    errors panel, the last result and the last sweep's table."""
    kind, text = status_text(loop)
    colour = {"ok": _PASS, "busy": _MUTED, "idle": _MUTED, "compiled": _PASS}.get(kind, _FAIL)
    last = loop.last
    diagnostics = last.diagnostics if last is not None else ()
    target = loop.target
    parts = [
        f'<div class="mtw-editor-static" data-mtw-static="{html.escape(uid)}" style="{_BOX}">',
        f'<div style="font-weight:bold">MSL editor: {html.escape(target.name)}</div>',
        f'<div class="mtw-editor-static-status" style="color:{colour}">{html.escape(text)}</div>',
    ]
    if loop.knobs.names:
        setting = ", ".join(f"{k}={loop.knobs.label(v)}" for k, v in loop.config.items())
        parts.append(f'<div style="color:{_MUTED}">knobs: {html.escape(setting)}</div>')
    parts.append(code_html(loop.source, [d for d in diagnostics if d.file == "source"],
                           title=target.file_name("source")))
    if loop.has_header:
        header_diagnostics = [d for d in diagnostics if d.file == "header"]
        opened = " open" if header_diagnostics else ""
        parts.append(f"<details{opened}><summary>{html.escape(target.file_name('header'))}</summary>"
                     + code_html(loop.header, header_diagnostics) + "</details>")
    parts.append(errors_html(last, library=target.files.get("source"), uid=uid))
    parts.append(result_html(loop, uid=uid))
    if loop.last_sweep is not None:
        parts.append(f'<div style="margin-top:6px">{loop.last_sweep._repr_html_()}</div>')
    parts.append("</div>")
    return "".join(parts)
