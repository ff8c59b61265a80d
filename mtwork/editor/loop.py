"""The edit-compile-run-check loop behind `mtwork.editor`, without any widget.

An `EditLoop` holds the texts being edited (a `Target`: a `KernelSpec`'s files, a
`metal_kernel` made in a cell, or a `load_metal` kernel's library), the knob setting, and
what the last run found. `run()` builds the launch for the current knobs (`build(config)`
returns an `mtwork.Launch`, or `kernel.launch(...)` for a full-source kernel; its kernel
is replaced by the one made from the edited texts), compiles, runs it through
`mtwork.run.Runner` (run, diff every output against the oracle, time when all match).
Nothing in the loop ever changes the texts: a compile error, a fault or an exception in
`build` becomes an `Outcome`, and the texts stay as they were. `submit()` and
`schedule()` do the same on a background thread; `cancel()` (and any edit while a kernel
runs) stops the running kernel at once. With `sanitize` on, each run is checked by the
sanitizer and its findings are put at their lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from ..backends import cancel as cancel_backend
from ..backends import resolve as resolve_backend
from ..dispatch import env_timeout
from ..errors import CompileError, KernelCancelled, KernelFault
from ..families import KernelSpec
from ..kernel import MetalKernel
from ..library_kernel import Kernel, LibraryLaunch
from ..modelled import GpuChoice, chip_for, estimate_of
from ..run import Runner
from ..sweep import Config, SweepInterrupted, SweepResult, sweep
from ..timing import output_arrays
from .background import Worker
from .diagnostics import finding_diagnostics, parse_diagnostics
from .knobs import Knobs
from .outcome import Outcome
from .targets import Target

log = logging.getLogger(__name__)

Event = Literal["texts", "knobs", "options", "phase", "outcome", "sweep", "saved"]
Listener = Callable[[Event], None]
Build = Callable[[Config], Any]  # an mtwork.Launch or a full-source kernel.launch(...)

DEFAULT_TIMEOUT = 30.0  # seconds a kernel may run on sim, unless $MTWORK_TIMEOUT says
_RUNNING_PHASES = ("running", "checking", "timing", "modelling", "sweeping")


class EditLoop:
    """The texts of `kernel` being edited, and the loop that compiles, runs and checks them.

    - `kernel`: a `KernelSpec`, an `mtwork.metal_kernel` or a `load_metal` kernel.
    - `build(config)` returns the launch for a knob setting (an `mtwork.Launch`: grid,
      threadgroup, template values, defines, output shapes; or `kernel.launch(...)` of a
      full-source kernel); its kernel is swapped for the edited one.
    - `inputs`: the arrays the kernel runs on (unless the launch carries its own); the
      oracle gets them too.
    - `oracle`: expected outputs, a function of the inputs, or one that also takes
      `config=` (as `mtwork.sweep` takes it); None: run without checking.
    - `knobs`: the parameter space (`Knobs`); `diff_options` go to `mtwork.diff`.
    - `backend`: "sim" or "metal" (default: the default backend); `timeout`: seconds a
      run may take on sim before the watchdog stops it, when the launch sets none
      (default: $MTWORK_TIMEOUT, else 30).
    - `sanitize`: check every run with the sanitizer (on sim; not timed); its findings
      become diagnostics at their lines and the outcome's status "unsafe".
    - `bench_rounds`, `bench_warmup`: timing after a correct run (0 rounds: no timing).
    - `gpu`: the Apple GPU a correct run is modelled on (one profiled run: its modelled
      time and bound), and the Sweep ranks by (see `mtwork.sweep`); False: no model.
    """

    def __init__(
        self,
        kernel: KernelSpec | MetalKernel | Kernel,
        build: Build,
        *,
        inputs: Sequence[Any] = (),
        oracle: Any = None,
        knobs: Knobs | None = None,
        diff_options: Mapping[str, Any] | None = None,
        backend: str | None = None,
        timeout: float | None = None,
        sanitize: bool = False,
        bench_rounds: int = 3,
        bench_warmup: int = 1,
        gpu: GpuChoice = None,
    ):
        self.target = Target(kernel)
        self.build = build
        self.inputs = list(inputs)
        self.oracle = oracle
        self.knobs = knobs or Knobs()
        self.diff_options = dict(diff_options or {})
        self.backend = resolve_backend(backend)
        self.timeout = timeout if timeout is not None else env_timeout() or DEFAULT_TIMEOUT
        self.bench_rounds = bench_rounds
        self.bench_warmup = bench_warmup
        self.chip = chip_for(gpu)
        self.last: Outcome | None = None
        self.last_good: Outcome | None = None
        self.last_sweep: SweepResult | None = None
        self.phase = "idle"
        self._run_lock = threading.Lock()
        self._cancelled = threading.Event()
        self._numbers = itertools.count(1)
        self._runner = Runner(inputs=self.inputs, oracle=oracle, diff_options=self.diff_options,
                              backend=self.backend, rounds=bench_rounds, warmup=bench_warmup,
                              names=self.target.output_names, on_phase=self._set_phase,
                              sanitize="report" if sanitize else None)
        self._listeners: list[Listener] = []
        self.worker = Worker()
        self._materialize_inputs()

    def _materialize_inputs(self) -> None:
        """Evaluate the inputs here: MLX streams belong to the thread that made them, so
        arrays still lazy could not be evaluated by the background thread."""
        arrays = list(self.inputs)
        if self.oracle is not None and not callable(self.oracle):
            arrays += output_arrays(self.oracle)
        try:
            launch = self.build(self.knobs.config)
            arrays += list(getattr(launch, "inputs", None) or [])
        except Exception:  # noqa: BLE001 - a failing build is reported by run()
            pass
        lazy = [a for a in arrays if isinstance(a, mx.array)]
        if lazy:
            mx.eval(lazy)

    # --- the texts ----------------------------------------------------------------------

    @property
    def source(self) -> str:
        return self.target.texts()[0]

    @property
    def header(self) -> str:
        return self.target.texts()[1]

    @property
    def has_header(self) -> bool:
        return self.target.has_header

    def set_source(self, text: str) -> None:
        """Replaces the body's text; a kernel still running the old text is stopped."""
        self.target.set("source", text)
        self._stop_stale()
        self._emit("texts")

    def set_header(self, text: str) -> None:
        self.target.set("header", text)
        self._stop_stale()
        self._emit("texts")

    def _stop_stale(self) -> None:
        if self.phase in ("running", "checking", "timing", "modelling"):
            self.cancel()

    @property
    def dirty(self) -> bool:
        """True when a text differs from its file (or has none yet)."""
        return bool(self.target.changed())

    def save(self, **paths: str | Path) -> list[Path]:
        """Writes the texts that differ from their files, atomically; `source=` and
        `header=` give the files of a kernel that has none yet. Returns the paths written."""
        written = self.target.save(**paths)
        self._emit("saved")
        return written

    def revert(self) -> None:
        """Replaces the texts by their files' contents."""
        self.target.revert()
        self._emit("texts")

    # --- knobs --------------------------------------------------------------------------

    @property
    def config(self) -> Config:
        return self.knobs.config

    def set_knob(self, name: str, value: Any) -> Config:
        """Turn one knob (others move if the constraints need it); does not run."""
        config = self.knobs.set(name, value)
        self._emit("knobs")
        return config

    @property
    def sanitize(self) -> bool:
        return self._runner.sanitize is not None

    def set_sanitize(self, on: bool) -> None:
        """Turns the sanitizer on or off for the runs that follow; does not run."""
        self._runner.sanitize = "report" if on else None
        self._emit("options")

    # --- building and running -----------------------------------------------------------

    def launch(self, config: Mapping[str, Any] | None = None,
               texts: tuple[str, str] | None = None) -> Any:
        """`build(config)` with the kernel made from the edited texts (or `texts`) in it,
        and the loop's timeout where the launch sets none."""
        config = Config(self.knobs.config if config is None else config)
        source, header = texts or self.target.texts()
        launch = self.target.swap(self.build(config), source, header)
        if isinstance(launch, LibraryLaunch):
            if "timeout" in launch.call:
                return launch
            return dataclasses.replace(launch, call={**launch.call, "timeout": self.timeout})
        return launch if launch.timeout is not None else dataclasses.replace(
            launch, timeout=self.timeout)

    def compile(self) -> Outcome:
        """Compile the edited texts for the current knobs without running them (on
        `metal`, MLX compiles at the first call, so this runs the kernel once)."""
        return self._step(run=False)

    def run(self) -> Outcome:
        """Compile, run, check against the oracle and time; returns (and keeps) the
        outcome. Blocks until done; `submit()` does it in the background."""
        return self._step(run=True)

    def submit(self) -> Future:
        """`run()` on the background thread; a run not yet started is replaced."""
        return self.worker.submit(self.run)

    def schedule(self, delay: float) -> None:
        """`submit()` after `delay` seconds of quiet (each call restarts the delay)."""
        self.worker.later(delay, self.run)

    def cancel(self) -> None:
        """Stops what runs now (a kernel, a sweep) and drops work not yet started. On sim
        the kernel ends at once (its worker process is ended) and the run's outcome is
        "cancelled"; on metal a dispatched kernel runs to its end."""
        self.worker.drop_pending()
        if self.phase in (*_RUNNING_PHASES, "compiling"):
            self._cancelled.set()
            on_sim = self.sanitize or self.phase == "modelling"  # on sim, whatever the backend
            cancel_backend("sim" if on_sim else self.backend)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Wait until background work is done; returns the last outcome."""
        if not self.worker.wait(timeout):
            raise TimeoutError(f"the editor was still busy after {timeout} s")
        return self.last

    def sweep(self, *, budget: int | None = None, rounds: int = 3, warmup: int = 1,
              strategy: Literal["exhaustive", "random", "latin"] | None = None,
              seed: int = 0, skip_compile_errors: bool = True) -> SweepResult:
        """`mtwork.sweep` of the edited kernel over the knobs' space and constraints.
        `strategy` None: every setting when `budget` covers them, else a seeded Latin
        hypercube of `budget` settings (every value of every knob tried). Settings of a
        compile error class already seen are skipped (`skip_compile_errors`). `cancel()`
        stops it; the settings that finished are kept."""
        if not self.knobs.space:
            raise ValueError("this editor has no knobs to sweep over: give "
                             "mtwork.editor(..., space={name: values}) to sweep")
        if strategy is None:
            covered = budget is None or budget >= len(self.knobs.valid)
            strategy = "exhaustive" if covered else "latin"
        with self._run_lock:
            self._cancelled.clear()
            self._set_phase("sweeping")
            source, header = self.target.texts()
            try:
                result = sweep(
                    lambda config: self._sweep_launch(config, (source, header)),
                    self.knobs.space, inputs=self.inputs, oracle=self.oracle,
                    diff_options=self.diff_options, constraints=self.knobs.rules,
                    strategy=strategy, budget=budget, seed=seed,
                    key=hashlib.sha256(f"{source}\0{header}".encode()).hexdigest(),
                    backend=self.backend, rounds=rounds, warmup=warmup, progress=False,
                    skip_compile_errors=skip_compile_errors,
                    gpu=False if self.chip is None else self.chip,
                )
            except SweepInterrupted as stopped:
                result = stopped.result
            finally:
                self._set_phase("idle")
        self.last_sweep = result
        self._emit("sweep")
        return result

    def submit_sweep(self, **options: Any) -> Future:
        return self.worker.submit(lambda: self.sweep(**options))

    def _sweep_launch(self, config: Config, texts: tuple[str, str]) -> Any:
        if self._cancelled.is_set():
            raise KernelCancelled(self.target.name, "the sweep was stopped")
        return self.launch(config, texts)

    # --- listeners ----------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(event)` after each change: "texts", "knobs", "phase",
        "outcome", "sweep", "saved" (from the background thread, for background work)."""
        self._listeners.append(listener)

    def _emit(self, event: Event) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a display that fails must not stop the loop
                log.exception("editor listener failed on %r", event)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self._emit("phase")

    # --- one step -----------------------------------------------------------------------

    def _step(self, *, run: bool) -> Outcome:
        with self._run_lock:
            self._cancelled.clear()
            source, header = self.target.texts()
            config = self.knobs.config
            number = next(self._numbers)
            started = time.perf_counter()
            fields: dict[str, Any] = {}
            launch = None
            try:
                self._set_phase("compiling")
                launch = self.launch(config, (source, header))
                self._compile(launch)
                if self._cancelled.is_set():
                    raise KernelCancelled(self.target.name, "stopped before it ran")
                fields = self._run_and_check(launch, config) if run else {"status": "compiled"}
            except KernelCancelled as exc:
                fields = {"status": "cancelled", "message": str(exc)}
            except CompileError as exc:
                shift = launch.define_line_count if launch else 0
                fields = {"status": "compile_error", "message": exc.message,
                          "diagnostics": tuple(parse_diagnostics(exc.message,
                                                                 header_shift=shift))}
            except KernelFault as exc:
                fields = {"status": "fault", "message": str(exc),
                          "log": getattr(exc, "log", None)}
            except Exception as exc:  # noqa: BLE001 - any failure is this run's outcome
                fields = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
            finally:
                self.phase = "idle"  # told with the outcome, below
            outcome = Outcome(number=number, source=source, header=header,
                              config=dict(config), seconds=time.perf_counter() - started,
                              **fields)
            self.last = outcome
            if outcome.ok:
                self.last_good = outcome
        self._emit("outcome")
        if run and launch is not None and self._models(outcome):
            outcome = self._model(outcome, launch)
        return outcome

    def _models(self, outcome: Outcome) -> bool:
        return (self.chip is not None and outcome.status in ("ok", "ran")
                and not self.sanitize and not self._cancelled.is_set())

    def _model(self, outcome: Outcome, launch: Any) -> Outcome:
        """`outcome` with its modelled time: one profiled run, after the outcome is shown
        (the result does not wait for the model)."""
        assert self.chip is not None
        with self._run_lock:
            if self.last is not outcome:  # a newer run came first
                return outcome
            self._set_phase("modelling")
            try:
                _, estimate, _ = estimate_of(launch, self.inputs, self.chip)
            except KernelCancelled:
                estimate = None
            finally:
                self.phase = "idle"
            modelled = dataclasses.replace(outcome, estimate=estimate)
            self.last = modelled
            if self.last_good is outcome:
                self.last_good = modelled
        self._emit("outcome")
        return modelled

    def _compile(self, launch: Any) -> None:
        """Compiles ahead of the run where the backend can (MLX compiles at the first
        call)."""
        launch.compile(*self.inputs, backend=self.backend)

    def _run_and_check(self, launch: Any, config: Config) -> dict[str, Any]:
        result = self._runner.run(launch, config)
        fields: dict[str, Any] = {"diffs": tuple(result.diffs),
                                  "measurement": result.measurement,
                                  "sanitizer": result.sanitizer, "log": result.log,
                                  "header_shift": launch.define_line_count}
        if result.sanitizer is not None and not result.sanitizer.ok:
            fields["status"] = "unsafe"
            fields["diagnostics"] = tuple(finding_diagnostics(
                result.sanitizer, self.target.files.get("source")))
        elif result.ok:
            fields["status"] = "ok" if result.checked else "ran"
        elif result.status in ("compile_error", "fault", "wrong"):
            fields["status"] = result.status
        else:
            fields["status"] = "error"
        if result.message and not (result.status == "wrong" and result.diffs):
            fields["message"] = result.message
        return fields
