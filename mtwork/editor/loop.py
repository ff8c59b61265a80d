"""The edit-compile-run-check loop behind `mtwork.editor`, without any widget.

An `EditLoop` holds the texts being edited (a `Target`: a `KernelSpec`'s files, a
`metal_kernel` made in a cell, or a `load_metal` kernel's library), the knob setting, and
what the last run found. `run()` builds the launch for the current knobs (`build(config)`
returns an `mtwork.Launch`, or `kernel.launch(...)` for a full-source kernel; its kernel
is replaced by the one made from the edited texts), compiles, runs it through
`mtwork.run.Runner` (run, diff every output against the oracle, time when all match).
Nothing in the loop ever changes the texts: a compile error, a fault or an exception in
`build` becomes an `Outcome`, and the texts stay as they were. `submit()` and
`schedule()` do the same on a background thread.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from ..backends import resolve as resolve_backend
from ..display import TimeUnit
from ..errors import CompileError, KernelFault
from ..families import KernelSpec
from ..kernel import MetalKernel
from ..library_kernel import Kernel, LibraryLaunch
from ..oracle import DiffReport
from ..run import Runner
from ..sweep import Config, SweepResult, sweep
from ..timing import Measurement, output_arrays
from .background import Worker
from .diagnostics import Diagnostic, parse_diagnostics
from .knobs import Knobs
from .targets import Target

log = logging.getLogger(__name__)

Status = Literal["compiled", "ok", "ran", "wrong", "compile_error", "fault", "error"]
Event = Literal["texts", "knobs", "phase", "outcome", "sweep", "saved"]
Listener = Callable[[Event], None]
Build = Callable[[Config], Any]  # an mtwork.Launch or a full-source kernel.launch(...)

DEFAULT_TIMEOUT = 30.0  # seconds a kernel may run on sim before the watchdog stops it


@dataclass(frozen=True)
class Outcome:
    """What one compile (and run) of the edited texts gave."""

    number: int
    status: Status
    source: str
    header: str
    config: dict[str, Any]
    message: str = ""  # the compiler's text, the fault, or the error
    diagnostics: tuple[Diagnostic, ...] = ()
    diffs: tuple[DiffReport, ...] = ()
    measurement: Measurement | None = None
    seconds: float = 0.0  # wall time of the whole step

    @property
    def ok(self) -> bool:
        """Compiled and ran; and every output matched the oracle, when there is one."""
        return self.status in ("ok", "ran")

    @property
    def compiled(self) -> bool:
        return self.status != "compile_error"

    def summary(self) -> str:
        """One line: status, the diff verdicts and the time."""
        config = ", ".join(f"{k}={v}" for k, v in self.config.items())
        head = f"run #{self.number}: {_STATUS_TEXT[self.status]}"
        if config:
            head += f" [{config}]"
        parts = [head]
        if self.diffs:
            parts.append("; ".join(
                f"{d.name}: {'PASS' if d.ok else 'FAIL'}"
                + ("" if d.ok else f" {d.n_mismatch}/{d.size} mismatches") for d in self.diffs))
        if self.measurement is not None:
            median = self.measurement.median
            parts.append(f"median {TimeUnit.for_seconds(median).format(median)} "
                         f"[{self.measurement.clock.label}]")
        elif self.message and self.status != "compile_error":
            parts.append(self.message.splitlines()[0])
        return " — ".join(parts)


_STATUS_TEXT = {
    "compiled": "compiled",
    "ok": "correct",
    "ran": "ran — no oracle",
    "wrong": "wrong result",
    "compile_error": "compile error",
    "fault": "kernel fault",
    "error": "error",
}


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
      run may take on sim before the watchdog stops it (when the launch sets none).
    - `bench_rounds`, `bench_warmup`: timing after a correct run (0 rounds: no timing).
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
        timeout: float | None = DEFAULT_TIMEOUT,
        bench_rounds: int = 3,
        bench_warmup: int = 1,
    ):
        self.target = Target(kernel)
        self.build = build
        self.inputs = list(inputs)
        self.oracle = oracle
        self.knobs = knobs or Knobs()
        self.diff_options = dict(diff_options or {})
        self.backend = resolve_backend(backend)
        self.timeout = timeout
        self.bench_rounds = bench_rounds
        self.bench_warmup = bench_warmup
        self.last: Outcome | None = None
        self.last_good: Outcome | None = None
        self.last_sweep: SweepResult | None = None
        self.phase = "idle"
        self._run_lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._runner = Runner(inputs=self.inputs, oracle=oracle, diff_options=self.diff_options,
                              backend=self.backend, rounds=bench_rounds, warmup=bench_warmup,
                              names=self.target.output_names, on_phase=self._set_phase)
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
        self.target.set("source", text)
        self._emit("texts")

    def set_header(self, text: str) -> None:
        self.target.set("header", text)
        self._emit("texts")

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

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Wait until background work is done; returns the last outcome."""
        if not self.worker.wait(timeout):
            raise TimeoutError(f"the editor was still busy after {timeout} s")
        return self.last

    def sweep(self, *, budget: int | None = None, rounds: int = 3, warmup: int = 1,
              strategy: Literal["exhaustive", "random"] = "exhaustive") -> SweepResult:
        """`mtwork.sweep` of the edited kernel over the knobs' space and constraints."""
        if not self.knobs.space:
            raise ValueError("this editor has no knobs to sweep over")
        with self._run_lock:
            self._set_phase("sweeping")
            try:
                source, header = self.target.texts()
                result = sweep(
                    lambda config: self.launch(config, (source, header)), self.knobs.space,
                    inputs=self.inputs, oracle=self.oracle, diff_options=self.diff_options,
                    constraints=self.knobs.rules, strategy=strategy, budget=budget,
                    key=hashlib.sha256(f"{source}\0{header}".encode()).hexdigest(),
                    backend=self.backend, rounds=rounds, warmup=warmup, progress=False,
                )
            finally:
                self._set_phase("idle")
        self.last_sweep = result
        self._emit("sweep")
        return result

    def submit_sweep(self, **options: Any) -> Future:
        return self.worker.submit(lambda: self.sweep(**options))

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
                fields = self._run_and_check(launch, config) if run else {"status": "compiled"}
            except CompileError as exc:
                shift = launch.define_line_count if launch else 0
                fields = {"status": "compile_error", "message": exc.message,
                          "diagnostics": tuple(parse_diagnostics(exc.message,
                                                                 header_shift=shift))}
            except KernelFault as exc:
                fields = {"status": "fault", "message": str(exc)}
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
        return outcome

    def _compile(self, launch: Any) -> None:
        """Compiles ahead of the run where the backend can (MLX compiles at the first
        call)."""
        launch.compile(*self.inputs, backend=self.backend)

    def _run_and_check(self, launch: Any, config: Config) -> dict[str, Any]:
        result = self._runner.run(launch, config)
        fields: dict[str, Any] = {"diffs": tuple(result.diffs),
                                  "measurement": result.measurement}
        if result.ok:
            fields["status"] = "ok" if result.checked else "ran"
        elif result.status in ("compile_error", "fault", "wrong"):
            fields["status"] = result.status
        else:
            fields["status"] = "error"
        if result.message and not (result.status == "wrong" and result.diffs):
            fields["message"] = result.message
        return fields
