"""One runner for every tool: run a built kernel, check it against the oracle, time it.

`mtwork.sweep`, the live editor and the notebooks all go through `Runner.run`, so a
configuration means the same thing everywhere: the first call (compile included, timed
apart; on `sim`, when the runner models, it is the profiled run too), `mtwork.diff` of
every output against the oracle's, then `timing.bench` when the outputs are right. What
happens is an `Outcome`, never an exception: ``ok``, ``wrong`` (not timed),
``compile_error``, ``fault`` (faults, deadlocks, timeouts, threadgroup memory),
``oracle_error`` (an oracle for this configuration raised) or ``error`` (anything else,
e.g. a launch the kernel API rejects). A kernel cancelled from
outside (`KernelCancelled`) is no outcome: it is raised to whoever stopped it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .display import callable_name
from .errors import (
    CompileError,
    KernelCancelled,
    KernelFault,
    OracleError,
    SweepError,
    UnknownParameterError,
)
from .gpu.chips import Chip
from .gpu.counters import Counters
from .gpu.model import Estimate
from .kernel import Launch
from .kernel_log import KernelLog, quietly
from .library_kernel import LibraryLaunch
from .modelled import estimate_for, estimate_of
from .oracle import DiffReport, diff
from .recording import watching_calls
from .sanitizer import SanitizerReport
from .timing import Measurement, bench, output_arrays, wait_for

__all__ = ["FAILED", "Oracle", "Outcome", "Runner", "Status", "outcome_of"]

# "skipped" is a sweep's: a setting of a compile error class already seen, not run.
Status = Literal["ok", "wrong", "compile_error", "fault", "oracle_error", "error", "skipped"]
FAILED: tuple[Status, ...] = ("wrong", "compile_error", "fault", "oracle_error", "error")


@dataclass
class Outcome:
    """What running one built kernel gave. `checked` is False when there was no oracle:
    then ``ok`` only means it ran."""

    status: Status = "ok"
    diffs: list[DiffReport] = field(default_factory=list)
    measurement: Measurement | None = None
    first_call_s: float | None = None  # the first call, compile (and the count, when it
    # models on sim) included; not a sample
    error_type: str | None = None
    message: str | None = None
    checked: bool = False
    sanitizer: SanitizerReport | None = None  # when the runner sanitizes
    counters: Counters | None = None  # of one profiled run, when the runner models
    estimate: Estimate | None = None  # the modelled time on the runner's chip
    model_note: str | None = None  # why there is no estimate
    log: KernelLog | None = None  # the kernel's messages in its first call (os_log, sim)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def outcome_of(exc: Exception) -> Outcome:
    """The outcome an exception from building or running a kernel stands for; mistakes in
    the set-up itself (`SweepError`) and kernels stopped from outside are raised."""
    if isinstance(exc, (SweepError, KernelCancelled)):
        raise exc
    status: Status = ("compile_error" if isinstance(exc, CompileError)
                      else "fault" if isinstance(exc, KernelFault) else "error")
    return Outcome(status, error_type=type(exc).__name__, message=str(exc),
                   log=getattr(exc, "log", None))


def takes_config(fn: Any) -> bool:
    """Whether a callable accepts a `config=` keyword."""
    try:
        return "config" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Oracle:
    """The expected outputs: given as they are, from ``oracle(*inputs)`` (computed once),
    or from ``oracle(*inputs, config=...)`` (per configuration, cached by it)."""

    def __init__(self, oracle: Any, inputs: Sequence[Any]):
        self.oracle = oracle
        self.inputs = list(inputs)
        self.per_config = callable(oracle) and takes_config(oracle)
        self._cache: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return self.oracle is not None

    def expected(self, config: Mapping[str, Any]) -> Any:
        """The outputs expected for `config`. A shared oracle that raises stops
        everything (`OracleError`); a per-configuration one raises as it does."""
        if not callable(self.oracle):
            return self.oracle
        key = repr(sorted(dict(config).items())) if self.per_config else ""
        if key not in self._cache:
            if self.per_config:
                self._cache[key] = self.oracle(*self.inputs, config=config)
            else:
                try:
                    self._cache[key] = self.oracle(*self.inputs)
                except Exception as exc:  # noqa: BLE001 - any oracle failure stops the run
                    raise OracleError(
                        f"the oracle {callable_name(self.oracle)} raised "
                        f"{type(exc).__name__}: {exc}. Nothing was checked; fix the oracle "
                        "(or pass oracle=None to run without checking)") from exc
        return self._cache[key]


def _quiet(_phase: str) -> None:
    """No one is listening (a module-level function: a runner may travel by pickle)."""


class Runner:
    """Runs built kernels on `inputs`: checked against `oracle` (see `Oracle`), with
    `diff_options` for `mtwork.diff`, timed over `rounds` after `warmup` calls on
    `backend`'s clock (0 rounds: not timed). `names` label the outputs in the diffs.
    `sanitize` (a mode of `kernel(sanitize=...)`, e.g. "report") runs the first call under
    the sanitizer and keeps its report on the outcome; sanitized runs are not timed.
    With a `chip`, a passing kernel runs once more with the profiler and the outcome
    keeps its counters and modelled time on that chip (see `mtwork.modelled`).
    `on_phase(name)` hears "running", "checking", "timing" and "modelling" as they start."""

    def __init__(self, *, inputs: Sequence[Any] = (), oracle: Any = None,
                 diff_options: Mapping[str, Any] | None = None, backend: str,
                 rounds: int = 5, warmup: int = 1, names: Sequence[str] = (),
                 sanitize: bool | str | None = None, chip: Chip | None = None,
                 on_phase: Callable[[str], None] | None = None):
        self.inputs = list(inputs)
        self.oracle = Oracle(oracle, self.inputs)
        self.diff_options = dict(diff_options or {})
        self.backend = backend
        self.rounds = rounds
        self.warmup = warmup
        self.names = list(names)
        self.sanitize = sanitize
        self.chip = chip
        self.on_phase = on_phase or _quiet

    def call(self, built: Any, sanitize: bool | str | None = None,
             profile: bool = False) -> Callable[[], Any]:
        """`built` (a `Launch` or `LibraryLaunch`, run on the runner's backend, or any
        callable) as a call on the runner's inputs."""
        if isinstance(built, LibraryLaunch):
            return lambda: built(backend=self.backend, sanitize=sanitize, profile=profile)
        if isinstance(built, Launch):
            return lambda: built(*self.inputs, backend=self.backend, sanitize=sanitize,
                                 profile=profile)
        if not callable(built):
            raise SweepError(f"build(config) must return an mtwork.Launch or a callable, "
                             f"got {type(built).__name__}")
        return lambda: built(*self.inputs)

    def counts_first(self, built: Any) -> bool:
        """Whether the first call of `built` is the model's profiled run too: on `sim`,
        where a profiled call's outputs are a plain call's, so the model adds no call."""
        return (self.chip is not None and not self.sanitize and self.backend == "sim"
                and isinstance(built, (Launch, LibraryLaunch)))

    def run(self, built: Any, config: Mapping[str, Any]) -> Outcome:
        """Runs, checks and times `built` for `config`; the kernel's log is the outcome's,
        not printed (`kernel_log.quietly`)."""
        with quietly():
            return self._run(built, config)

    def _run(self, built: Any, config: Mapping[str, Any]) -> Outcome:
        fn = self.call(built)
        expected = None
        if self.oracle and self.oracle.per_config:
            try:
                expected = self.oracle.expected(config)
            except UnknownParameterError:
                raise
            except Exception as exc:  # noqa: BLE001 - this configuration's outcome
                return Outcome("oracle_error", error_type=type(exc).__name__,
                               message=f"the oracle raised {type(exc).__name__}: {exc}")
        elif self.oracle:
            expected = self.oracle.expected(config)
        self.on_phase("running")
        start = time.perf_counter()
        try:
            with watching_calls() as dispatched:  # what a plain callable runs
                outputs, counted, model_note = self._first_call(built, fn)
        except UnknownParameterError:
            raise
        except Exception as exc:  # noqa: BLE001 - this configuration's outcome
            failed = outcome_of(exc)
            failed.sanitizer = getattr(exc, "report", None)
            return failed
        outcome = Outcome(first_call_s=time.perf_counter() - start,
                          sanitizer=getattr(built, "sanitizer_report", None)
                          if self.sanitize else None, model_note=model_note,
                          log=getattr(built, "last_log", None))
        if self.oracle:
            self.on_phase("checking")
            self._check(outcome, outputs, expected)
            if not outcome.ok:
                return outcome
        if self.rounds > 0 and not self.sanitize:
            self.on_phase("timing")
            try:
                outcome.measurement = bench(fn, warmup=self.warmup, rounds=self.rounds,
                                            backend=self.backend)
            except Exception as exc:  # noqa: BLE001 - e.g. a fault that shows up only later
                failed = outcome_of(exc)
                failed.first_call_s, failed.diffs = outcome.first_call_s, outcome.diffs
                return failed
        if self.chip is not None and not self.sanitize and model_note is None:
            self.on_phase("modelling")
            self._model(outcome, built, counted, dispatched)
        return outcome

    def _model(self, outcome: Outcome, built: Any, counted: bool,
               dispatched: list[str]) -> None:
        """The outcome's counters and modelled time: from the first call when it counted,
        else from a profiled run now (`dispatched`: the kernels the first call made)."""
        assert self.chip is not None
        if counted:
            outcome.counters = built.last_counters
            outcome.estimate, outcome.model_note = estimate_for(outcome.counters, self.chip)
        else:
            outcome.counters, outcome.estimate, outcome.model_note = estimate_of(
                built, self.inputs, self.chip, dispatched)

    def _first_call(self, built: Any, fn: Callable[[], Any]
                    ) -> tuple[Any, bool, str | None]:
        """The first call's outputs; whether it counted for the model too (`counts_first`);
        why the model is missing, when the profiled call failed and a plain one did not
        (then its outputs are the plain call's)."""
        if self.sanitize:
            outputs = self.call(built, self.sanitize)()
        elif self.counts_first(built):
            try:
                outputs = self.call(built, profile=True)()
                wait_for(outputs, self.backend)
                return outputs, True, None
            except (UnknownParameterError, KernelCancelled):
                raise
            except Exception as exc:  # noqa: BLE001 - the model is missing, the run stands
                note = f"not modelled: the profiled run raised {type(exc).__name__}: {exc}"
                outputs = fn()
                wait_for(outputs, self.backend)
                return outputs, False, note
        else:
            outputs = fn()
        wait_for(outputs, self.backend)
        return outputs, False, None

    def _check(self, outcome: Outcome, outputs: Any, expected: Any) -> None:
        """Diffs outputs against the oracle's; marks the outcome wrong when they differ."""
        outcome.checked = True
        got, want = output_arrays(outputs), output_arrays(expected)
        if len(got) != len(want):
            outcome.status = "wrong"
            outcome.message = f"the kernel returned {len(got)} outputs, the oracle {len(want)}"
            return
        try:
            outcome.diffs = [
                diff(a, e, name=self.names[i] if i < len(self.names) else f"output {i}",
                     **self.diff_options)
                for i, (a, e) in enumerate(zip(got, want))
            ]
        except ValueError as exc:  # e.g. shapes that do not match
            outcome.status, outcome.error_type, outcome.message = (
                "wrong", type(exc).__name__, str(exc))
            return
        bad = [d for d in outcome.diffs if not d.ok]
        if bad:
            outcome.status = "wrong"
            outcome.message = "; ".join(
                f"{d.name}: {d.n_mismatch}/{d.size} mismatches"
                + ("" if d.max_abs_err is None else f", max abs err {d.max_abs_err:.3g}")
                for d in bad)
