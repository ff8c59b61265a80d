"""The editor as Jupyter widgets: a CodeMirror 6 view of the kernel's MSL (`CodeEditor`, an
anywidget) above the errors, the last result, the knobs and a sweep button (`Editor`).

Everything the widgets do goes through `EditLoop`, and every action has a Python method
on `Editor` (set_source, compile, run, cancel, set_sanitize, set_knob, sweep, save,
revert), so the editor works without a browser. Edits made in the browser are compiled
and run after `debounce` seconds of quiet, or at once on Ctrl/Cmd-Enter, on a background
thread. Stop ends a running kernel; Sanitize checks each run with the sanitizer.
"""

from __future__ import annotations

import html
import json
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from ..sweep import Config, SweepResult
from .diagnostics import Diagnostic
from .loop import EditLoop, Event
from .outcome import Outcome
from .panels import errors_html, result_html, snapshot_html, status_text

STATIC = Path(__file__).parent / "static"


class CodeEditor(anywidget.AnyWidget):
    """CodeMirror 6 with MSL highlighting, line numbers, bracket matching and inline
    compiler diagnostics, for a kernel body (`source`) and its `header`."""

    _esm = STATIC / "editor.js"
    _css = STATIC / "editor.css"

    source = traitlets.Unicode("").tag(sync=True)
    header = traitlets.Unicode("").tag(sync=True)
    file_names = traitlets.Dict().tag(sync=True)  # {"source": name, "header": name}
    active = traitlets.Unicode("source").tag(sync=True)
    diagnostics = traitlets.List().tag(sync=True)  # Diagnostic.to_dict()s
    status = traitlets.Unicode("idle").tag(sync=True)
    status_text = traitlets.Unicode("").tag(sync=True)
    dirty = traitlets.Bool(False).tag(sync=True)
    uid = traitlets.Unicode("").tag(sync=True)  # ties the view to its static copy
    height = traitlets.Unicode("320px").tag(sync=True)


class Snapshot:
    """The editor's state as static HTML (what an exported notebook shows)."""

    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return "<mtwork editor snapshot>"


class Editor:
    """Live MSL editing of one kernel; make one with `mtwork.editor(...)`."""

    def __init__(self, loop: EditLoop, *, debounce: float = 0.8, sweep_budget: int | None = 16,
                 sweep_rounds: int = 3, height: str = "320px"):
        self.loop = loop
        self.debounce = debounce
        self.sweep_budget = sweep_budget
        self.sweep_rounds = sweep_rounds
        self.uid = uuid.uuid4().hex[:12]
        self._from_python = threading.local()
        names = {"source": loop.target.file_name("source")}
        if loop.has_header:
            names["header"] = loop.target.file_name("header")
        self.code = CodeEditor(source=loop.source, header=loop.header, file_names=names,
                               uid=self.uid, height=height)
        self.code.observe(self._on_typing, names=["source", "header"])
        self.code.on_msg(self._on_message)
        self._errors = widgets.HTML()
        self._result = widgets.HTML()
        self._knobs = {name: self._knob_widget(name) for name in loop.knobs.names}
        self._stop_button = widgets.Button(
            description="Stop", icon="stop", button_style="danger", disabled=True,
            tooltip="Stop the running kernel or sweep now", layout=widgets.Layout(width="auto"))
        self._stop_button.on_click(lambda _: self.cancel())
        self._sanitize_toggle = widgets.ToggleButton(
            value=loop.sanitize, description="Sanitize", icon="shield",
            tooltip="Check each run with the sanitizer (on sim): races, out-of-bounds, "
                    "uninitialised reads, divergent barriers; findings shown at their lines",
            layout=widgets.Layout(width="auto"))
        self._sanitize_toggle.observe(self._on_sanitize, names="value")
        self._sweep_button = widgets.Button(
            description=self._sweep_label(), icon="bar-chart", disabled=not self._knobs,
            tooltip=self._sweep_tooltip(), layout=widgets.Layout(width="auto"))
        self._sweep_button.on_click(lambda _: self._sweep_in_background())
        self._sweep_hint = widgets.HTML(
            "" if self._knobs else '<span style="color:#57606a">to sweep, give '
            "<code>mtwork.editor(..., space={name: values})</code></span>")
        self._sweep_out = widgets.Output()
        controls = widgets.HBox([*self._knobs.values(), self._stop_button,
                                 self._sanitize_toggle, self._sweep_button, self._sweep_hint],
                                layout=widgets.Layout(flex_flow="row wrap"))
        self.widget = widgets.VBox([self.code, controls, self._errors, self._result,
                                    self._sweep_out])
        self.widget.add_class("mtw-editor-live")
        self._static = None
        loop.subscribe(self._on_event)
        self._refresh()

    # --- Python API ---------------------------------------------------------------------

    @property
    def source(self) -> str:
        return self.loop.source

    @property
    def header(self) -> str:
        return self.loop.header

    @property
    def config(self) -> Config:
        return self.loop.config

    @property
    def last(self) -> Outcome | None:
        return self.loop.last

    @property
    def last_good(self) -> Outcome | None:
        return self.loop.last_good

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.loop.last.diagnostics if self.loop.last else ()

    def set_source(self, text: str) -> None:
        """Replace the kernel body's text (does not run; `run()` does)."""
        self.loop.set_source(text)

    def set_header(self, text: str) -> None:
        self.loop.set_header(text)

    def compile(self) -> Outcome:
        return self.loop.compile()

    def cancel(self) -> None:
        """Stop the running kernel (or sweep) now, as the Stop button does."""
        self.loop.cancel()

    def set_sanitize(self, on: bool) -> None:
        """Turn the sanitizer on or off for the runs that follow (the Sanitize toggle)."""
        self.loop.set_sanitize(on)

    def run(self) -> Outcome:
        """Compile, run, diff against the oracle and time, now; returns the outcome."""
        return self.loop.run()

    def set_knob(self, name: str, value: Any) -> Config:
        """Turn a knob (others move if the constraints need it); `run()` to see it."""
        return self.loop.set_knob(name, value)

    def sweep(self, budget: int | None = None) -> SweepResult:
        """Sweep the edited kernel over the knobs; shows the table and plot."""
        options = self._sweep_options()
        if budget is not None:
            options["budget"] = budget
        return self.loop.sweep(**options)

    def save(self, **paths: str | Path) -> list[Path]:
        """Writes the edited texts to their files (`source=`/`header=` name them for a
        kernel made in a cell)."""
        return self.loop.save(**paths)

    def revert(self) -> None:
        self.loop.revert()

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Wait for background work (typing, knobs, the sweep button) to finish."""
        return self.loop.wait(timeout)

    def snapshot(self) -> Snapshot:
        return Snapshot(snapshot_html(self.loop, self.uid))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
        # A static copy for exported HTML; the live view hides it (same uid).
        self._static = display(self.snapshot(), display_id=True)

    def __repr__(self) -> str:
        return f"<mtwork editor of {self.loop.target.name}: {status_text(self.loop)[1]}>"

    # --- widgets ------------------------------------------------------------------------

    def _knob_widget(self, name: str) -> widgets.Widget:
        values = self.loop.knobs.allowed(name)
        options = [(self.loop.knobs.label(v), i) for i, v in enumerate(values)]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        common = dict(options=options, value=self._knob_index(name, values), description=name,
                      style={"description_width": "initial"})
        if numeric and len(values) > 1:
            knob = widgets.SelectionSlider(continuous_update=False, **common)
        else:
            knob = widgets.Dropdown(disabled=len(values) == 1, **common)
        knob.observe(lambda change: self._on_knob(name, values[change["new"]]), names="value")
        return knob

    def _knob_index(self, name: str, values: Sequence[Any]) -> int:
        current = self.loop.config[name]
        return next(i for i, v in enumerate(values) if v is current or v == current)

    def _sweep_size(self) -> tuple[int, int]:
        """(settings the button sweeps, valid settings)."""
        size = len(self.loop.knobs.valid) if self.loop.knobs.names else 0
        return (min(size, self.sweep_budget) if self.sweep_budget else size), size

    def _sweep_label(self) -> str:
        if not self.loop.knobs.names:
            return "Sweep (no knobs)"
        chosen, size = self._sweep_size()
        return f"Sweep ({chosen} settings)" if chosen == size else \
            f"Sweep ({chosen} of {size} settings)"

    def _sweep_tooltip(self) -> str:
        if not self.loop.knobs.names:
            return "no knobs to sweep: give mtwork.editor(..., space={name: values})"
        chosen, size = self._sweep_size()
        how = ("every valid setting" if chosen == size else
               f"a seeded Latin hypercube of {chosen} of the {size} valid settings (every "
               "value of every knob tried)")
        return (f"mtwork.sweep over {how}; settings of a compile error already seen twice "
                "are skipped")

    def _sweep_options(self) -> dict[str, Any]:
        return {"budget": self.sweep_budget, "rounds": self.sweep_rounds}

    @contextmanager
    def _quietly(self) -> Iterator[None]:
        """Set widget values without treating them as the user's edits."""
        self._from_python.active = True
        try:
            yield
        finally:
            self._from_python.active = False

    def _quiet(self) -> bool:
        return getattr(self._from_python, "active", False)

    def _on_typing(self, change: Mapping[str, Any]) -> None:
        if self._quiet():
            return
        if change["name"] == "source":
            self.loop.set_source(change["new"])
        else:
            self.loop.set_header(change["new"])
        self.loop.schedule(self.debounce)

    def _on_message(self, _widget: Any, content: Mapping[str, Any], _buffers: Any) -> None:
        kind = content.get("type")
        if kind == "run":
            self.loop.submit()
        elif kind == "save":
            self.loop.save()

    def _on_sanitize(self, change: Mapping[str, Any]) -> None:
        if self._quiet():
            return
        self.loop.set_sanitize(bool(change["new"]))
        self.loop.submit()

    def _on_knob(self, name: str, value: Any) -> None:
        if self._quiet():
            return
        self.loop.set_knob(name, value)
        self.loop.submit()

    def _on_event(self, event: Event) -> None:
        if event == "texts":
            with self._quietly():
                self.code.source = self.loop.source
                self.code.header = self.loop.header
        elif event == "knobs":
            with self._quietly():
                for name, knob in self._knobs.items():
                    knob.value = self._knob_index(name, self.loop.knobs.allowed(name))
        elif event == "options":
            with self._quietly():
                self._sanitize_toggle.value = self.loop.sanitize
        elif event == "outcome":
            last = self.loop.last
            self.code.diagnostics = [d.to_dict() for d in last.diagnostics] if last else []
        elif event == "sweep":
            self._show_sweep(self.loop.last_sweep)
        self._refresh()
        if event in ("outcome", "sweep", "saved") and self._static is not None:
            self._static.update(self.snapshot())

    def _refresh(self) -> None:
        kind, text = status_text(self.loop)
        self.code.status, self.code.status_text = kind, text
        self.code.dirty = self.loop.dirty
        self._stop_button.disabled = self.loop.phase == "idle"
        library = self.loop.target.files.get("source")
        self._errors.value = errors_html(self.loop.last, library=library, uid=self.uid)
        self._result.value = result_html(self.loop, fold_passing=True, uid=self.uid)

    def _sweep_in_background(self) -> None:
        future = self.loop.submit_sweep(**self._sweep_options())
        future.add_done_callback(self._show_sweep_failure)

    def _show_sweep_failure(self, future: Future) -> None:
        if future.cancelled() or future.exception() is None:
            return
        exc = future.exception()
        self._sweep_out.outputs = ({"output_type": "display_data", "metadata": {}, "data": {
            "text/html": f'<pre style="color:#cf222e">sweep failed: '
                         f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</pre>",
            "text/plain": f"sweep failed: {type(exc).__name__}: {exc}",
        }},)

    def _show_sweep(self, result: SweepResult | None) -> None:
        if result is None:
            return
        outputs = [{"output_type": "display_data", "metadata": {},
                    "data": {"text/html": result._repr_html_(), "text/plain": str(result)}}]
        figure = sweep_figure(result)
        if figure is not None:
            outputs.append({"output_type": "display_data", "metadata": {}, "data": {
                "application/vnd.plotly.v1+json": json.loads(figure.to_json()),
                "text/plain": f"<plot of {len(result.records)} settings>",
            }})
        self._sweep_out.outputs = tuple(outputs)


def sweep_figure(result: SweepResult) -> Any:
    """A heatmap over the first two knobs that vary, or a line plot over the one that
    does; None when none varies or nothing ran."""
    from .. import plots

    varied = [name for name in result.parameters if len(result.values[name]) > 1]
    if not result.records or not varied:
        return None
    if len(varied) >= 2:
        return plots.heatmap(result, varied[0], varied[1])
    return plots.lines(result, varied[0])
