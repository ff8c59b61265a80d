"""The editor as Jupyter widgets: a CodeMirror 6 view of the kernel's MSL (`CodeEditor`, an
anywidget) above the errors, the last result, the knobs and a sweep button (`Editor`).

Everything the widgets do goes through `EditLoop`, and every action has a Python method
on `Editor` (set_source, compile, run, set_knob, sweep, save, revert), so the editor works
without a browser. Edits made in the browser are compiled and run after `debounce`
seconds of quiet, or at once on Ctrl/Cmd-Enter, on a background thread.
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

from ..families import KernelSpec, load_family
from ..kernel import MetalKernel
from ..library_kernel import Kernel
from ..sweep import Config, SweepResult
from .diagnostics import Diagnostic
from .knobs import Knobs, Rule
from .loop import DEFAULT_TIMEOUT, Build, EditLoop, Event, Outcome
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
        self._sweep_button = widgets.Button(
            description=f"Sweep ({self._sweep_size()} settings)", icon="bar-chart",
            disabled=not self._knobs, tooltip="mtwork.sweep over the knobs' space",
            layout=widgets.Layout(width="auto"))
        self._sweep_button.on_click(lambda _: self._sweep_in_background())
        self._sweep_out = widgets.Output()
        controls = widgets.HBox([*self._knobs.values(), self._sweep_button],
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

    def _sweep_size(self) -> int:
        size = len(self.loop.knobs.valid) if self.loop.knobs.names else 0
        return min(size, self.sweep_budget) if self.sweep_budget else size

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
        self._errors.value = errors_html(self.loop.last)
        self._result.value = result_html(self.loop, fold_passing=True)

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


def editor(
    kernel: KernelSpec | MetalKernel | Kernel | str,
    build: Build,
    *,
    inputs: Sequence[Any] = (),
    oracle: Any = None,
    space: Mapping[str, Sequence[Any]] | None = None,
    constraints: Sequence[Rule] = (),
    config: Mapping[str, Any] | None = None,
    diff_options: Mapping[str, Any] | None = None,
    backend: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    bench_rounds: int = 3,
    debounce: float = 0.8,
    sweep_budget: int | None = 16,
    sweep_rounds: int = 3,
    height: str = "320px",
    run: bool = True,
) -> Editor:
    """A live editor of a kernel's MSL: type, and it compiles, runs and diffs.

    - `kernel`: what to edit: a `KernelSpec` or "family/name" (e.g. "gguf/q8_0"), whose
      body and header files `save()` (or Ctrl/Cmd-S) writes back; an `mtwork.metal_kernel`
      made in a cell, whose texts stay in the editor until `save(source=path,
      header=path)`; or a kernel of `mtwork.load_metal`, whose library file is edited.
    - `build(config)` returns the launch for a knob setting: an `mtwork.Launch` (or, for
      a `load_metal` kernel, `kernel.launch(buffers=..., grid=..., ...)`); the editor runs
      it with its kernel replaced by the edited one. E.g. for gguf:
      `build=lambda c: gguf.launch("q8_0", packed, **c)`.
    - `inputs`, `oracle`, `diff_options`: as `mtwork.sweep` takes them.
    - `space` (name -> allowed values) and `constraints` (as `mtwork.sweep` takes them)
      become the knobs; `config` picks the starting setting.
    - `bench_rounds`: timing rounds after a correct run (0: none); `timeout`: seconds a
      run may take on sim; `debounce`: seconds of quiet before an edit runs.
    - `sweep_budget`, `sweep_rounds`: what the Sweep button does (at most that many
      settings, in the space's order; None: all).
    - `run`: start a first run in the background (`wait()` for it). In a notebook run
      headlessly, call `run()` or `wait()` before the cell ends, so that the exported
      HTML holds the result.
    """
    loop = EditLoop(_kernel(kernel), build, inputs=inputs, oracle=oracle,
                    knobs=Knobs(space, constraints, config), diff_options=diff_options,
                    backend=backend, timeout=timeout, bench_rounds=bench_rounds)
    made = Editor(loop, debounce=debounce, sweep_budget=sweep_budget,
                  sweep_rounds=sweep_rounds, height=height)
    if run:
        loop.submit()
    return made


def _kernel(kernel: KernelSpec | MetalKernel | Kernel | str
            ) -> KernelSpec | MetalKernel | Kernel:
    if not isinstance(kernel, str):
        return kernel
    family, _, name = kernel.partition("/")
    kernels = load_family(family).KERNELS
    if name not in kernels:
        raise ValueError(f"family {family!r} has no kernel {name!r}; it has "
                         f"{', '.join(kernels)} (write 'family/name')")
    return kernels[name]

