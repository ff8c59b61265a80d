"""Honest timing: warm-up, repeated rounds, robust statistics, and A/B comparisons reported
as paired ratios.

Two habits make kernel timings trustworthy, and both are built in here:

* **Interleave and pair.** Absolute latency drifts a lot between rounds on a laptop GPU
  (thermal and clock changes; swings near 90% have been seen on an M5 Max), but two
  variants run back to back within one round see the same conditions. `compare` runs
  every variant once per round, rotates which one starts (so no variant always goes
  first, or always runs on a cache the other one warmed) and reports, per variant, the
  median and range of the per-round ratios `baseline / variant`, not a ratio of averages.
* **Say which clock.** On `metal` a call that dispatches one kernel is timed per
  dispatch, from batches of back-to-back dispatches evaluated at once, with the launch
  cost (host encoding and the command buffer's round trip) reported apart
  (`mtwork.batched`); any other call is timed whole, host work included. On `sim` the
  clock measures the CPU emulator, which says nothing about GPU speed. Every result
  carries a `Clock` whose label, saying what was measured, appears in every printout and
  plot.

Times are in seconds throughout; printouts pick a readable unit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from .backends import resolve as resolve_backend
from .batched import PER_DISPATCH, WHOLE_CALL, batched
from .display import TimeUnit, html_table
from .kernel import Launch
from .kernel_log import quietly
from .library_kernel import LibraryLaunch

CLOCK_LABELS = {
    "metal": "GPU time (metal)",
    "sim": "emulator CPU time (sim) — not GPU speed",
}
# Above this coefficient of variation a measurement is flagged unstable (metaltile uses 5%).
DEFAULT_CV_THRESHOLD = 0.05

Timer = Callable[[], float]


@dataclass(frozen=True)
class Clock:
    """What a time measures: GPU time on `metal`, emulator CPU time on `sim`; `method`
    says how, where it matters (on metal: per dispatch in batches, or whole calls)."""

    backend: str
    method: str = ""

    @property
    def label(self) -> str:
        base = CLOCK_LABELS[self.backend]
        return f"{base}: {self.method}" if self.method else base

    def __str__(self) -> str:
        return self.label


def clock_for(backend: str | None) -> Clock:
    """The clock of `backend` (None: the default backend); fails if it cannot run here, so
    a label never claims GPU time that was not measured on a GPU."""
    return Clock(resolve_backend(backend))


# --- one function --------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """Timed samples of one function, in seconds, with their statistics."""

    samples: tuple[float, ...]
    clock: Clock
    name: str | None = None
    warmup: int = 0
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    # On metal, per round: what one evaluation costs besides its dispatches (see
    # mtwork.batched), kept apart from the samples.
    launch: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Measurement needs at least one sample")

    @classmethod
    def from_samples(
        cls,
        samples: Iterable[float],
        *,
        clock: Clock | str,
        name: str | None = None,
        warmup: int = 0,
        cv_threshold: float = DEFAULT_CV_THRESHOLD,
        launch: Iterable[float] = (),
    ) -> Measurement:
        """Build a Measurement from times taken elsewhere (or made up, in tests)."""
        clock = Clock(clock) if isinstance(clock, str) else clock
        return cls(tuple(float(s) for s in samples), clock, name, warmup, cv_threshold,
                   tuple(float(s) for s in launch))

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        return float(np.percentile(self.samples, 95))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def stdev(self) -> float | None:
        """Sample standard deviation; None for a single sample."""
        return statistics.stdev(self.samples) if self.rounds > 1 else None

    @property
    def cv(self) -> float | None:
        """Coefficient of variation (stdev / mean); None for a single sample."""
        sd = self.stdev
        if sd is None:
            return None
        return sd / self.mean if self.mean > 0 else math.inf

    @property
    def unstable(self) -> bool:
        cv = self.cv
        return cv is not None and cv > self.cv_threshold

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the samples and settings, plus the statistics for readers of the file."""
        return {
            "name": self.name,
            "backend": self.clock.backend,
            "clock_method": self.clock.method,
            "clock": self.clock.label,
            "launch": list(self.launch),
            "warmup": self.warmup,
            "cv_threshold": self.cv_threshold,
            "samples": list(self.samples),
            "min": self.min,
            "median": self.median,
            "p95": self.p95,
            "mean": self.mean,
            "cv": self.cv,
            "unstable": self.unstable,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        return cls.from_samples(
            data["samples"],
            clock=Clock(data["backend"], data.get("clock_method", "")),
            name=data.get("name"),
            warmup=data.get("warmup", 0),
            cv_threshold=data.get("cv_threshold", DEFAULT_CV_THRESHOLD),
            launch=data.get("launch", ()),
        )

    def summary(self, unit: TimeUnit | None = None) -> str:
        """One line of statistics, without the clock label."""
        unit = unit or TimeUnit.for_seconds(self.median)
        parts = [
            f"median {unit.format(self.median)}",
            f"min {unit.format(self.min)}",
            f"p95 {unit.format(self.p95)}",
            f"mean {unit.format(self.mean)}",
            f"CV {_format_cv(self.cv)}",
            f"({self.rounds} rounds, {self.warmup} warm-up)",
        ]
        if self.launch:
            parts.append(f"launch cost {unit.format(statistics.median(self.launch))} "
                         "per evaluation, apart")
        if self.unstable:
            parts.append(f"UNSTABLE: CV above {self.cv_threshold:.0%}")
        return "  ".join(parts)

    def __str__(self) -> str:
        head = f"{self.name}: " if self.name else ""
        return f"{head}{self.summary()}\n  [{self.clock.label}]"

    def _repr_html_(self) -> str:
        unit = TimeUnit.for_seconds(self.median)
        return html_table(
            caption=(self.name + " — " if self.name else "") + self.clock.label,
            header=["median", "min", "p95", "mean", "CV", "rounds", "warm-up"],
            rows=[stat_cells(self, unit) + [str(self.rounds), str(self.warmup)]],
            highlighted=[self.unstable],
            note=unstable_note(self.cv_threshold) if self.unstable else "",
        )


def bench(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    rounds: int = 10,
    backend: str | None = None,
    name: str | None = None,
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
    setup: Callable[[], Any] | None = None,
    timer: Timer = time.perf_counter,
) -> Measurement:
    """Time `fn()`: `warmup` untimed calls, then `rounds` timed ones.

    Each timed call waits for the call's outputs before the clock stops: `mx.eval` on
    every `mx.array` it returns (in lists, tuples or dicts too) and, on `metal`,
    `mx.synchronize()`. On `metal`, a call that dispatches one kernel is run once untimed
    and then timed per dispatch, in batches, its launch cost apart (`mtwork.batched`);
    the measurement's clock says which. `backend` (default: the default backend) picks
    the clock; it does not move `fn` to that backend, so run the kernel there yourself (or
    time a `mtwork.sweeps.Launch`, which is run on it). `setup()`, if given, runs untimed
    before every call: flush caches, or restore an output a kernel updates in place (what
    Triton's do_bench and `restore_value` do); such calls are timed whole. `timer` is for
    tests.
    """
    check_counts(warmup, rounds)
    clock = clock_for(backend)
    call = timed(on_backend(fn, clock.backend), clock, timer, setup)
    with quietly():  # a kernel that logs does not print every timed call's messages
        for _ in range(warmup):
            call()
        samples = [call()[0] for _ in range(rounds)]
    return Measurement.from_samples(
        samples, clock=call.clock, name=name, warmup=warmup, cv_threshold=cv_threshold,
        launch=call.launch[warmup:],
    )


# --- several variants ----------------------------------------------------------------------


# --- calling and waiting ---------------------------------------------------------------------


def output_arrays(outputs: Any) -> list[Any]:
    """The arrays in a call's result: one array, or a list/tuple/dict of them, in order."""
    if outputs is None:
        return []
    if isinstance(outputs, Mapping):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return [a for item in outputs for a in output_arrays(item)]
    return [outputs]


def wait_for(outputs: Any, backend: str) -> None:
    """Block until the call that produced `outputs` has finished on `backend`."""
    arrays = [a for a in output_arrays(outputs) if isinstance(a, mx.array)]
    if arrays:
        mx.eval(arrays)
    if backend == "metal":
        mx.synchronize()


class Timed:
    """A timed call: `()` gives (seconds, outputs); `clock` says what was measured,
    `launch` holds each call's launch cost where it was measured apart (metal)."""

    clock: Clock
    launch: list[float]

    def __call__(self) -> tuple[float, Any]:
        raise NotImplementedError


class _WholeCall(Timed):
    def __init__(self, fn: Callable[[], Any], clock: Clock, timer: Timer,
                 setup: Callable[[], Any] | None) -> None:
        self.fn, self.timer, self.setup = fn, timer, setup
        self.clock = Clock(clock.backend, WHOLE_CALL) if clock.backend == "metal" else clock
        self.launch = []

    def __call__(self) -> tuple[float, Any]:
        if self.setup is not None:
            wait_for(self.setup(), self.clock.backend)
        start = self.timer()
        outputs = self.fn()
        wait_for(outputs, self.clock.backend)
        return self.timer() - start, outputs


class _PerDispatch(Timed):
    def __init__(self, found: Any, clock: Clock) -> None:
        self.found, self.clock, self.launch = found, clock, found.launch

    def __call__(self) -> tuple[float, Any]:
        return self.found()


def timed(fn: Callable[[], Any], clock: Clock, timer: Timer,
          setup: Callable[[], Any] | None, *, per_dispatch: bool = True) -> Timed:
    """`fn` as a timed call on `clock`'s backend: on metal per dispatch where it can be
    (`per_dispatch`; see `mtwork.batched`), else as a whole call."""
    if clock.backend == "metal" and setup is None and per_dispatch:
        found = batched(fn, timer, lambda outputs: wait_for(outputs, "metal"))
        if found is not None:
            return _PerDispatch(found, Clock("metal", PER_DISPATCH))
    return _WholeCall(fn, clock, timer, setup)


def on_backend(fn: Callable[[], Any], backend: str) -> Callable[[], Any]:
    """A `Launch` (or `LibraryLaunch`) is run on the clock's backend, so the label is true
    for it."""
    if isinstance(fn, (Launch, LibraryLaunch)):
        return lambda: fn(backend=backend)
    return fn


def check_counts(warmup: int, rounds: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")


# --- formatting ------------------------------------------------------------------------------


def _format_cv(cv: float | None) -> str:
    return "n/a" if cv is None else f"{cv:.1%}"


def yes_no(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "—"}[value]


def stat_cells(m: Measurement, unit: TimeUnit) -> list[str]:
    cv = _format_cv(m.cv) + ("*" if m.unstable else "")
    return [unit.format(x) for x in (m.median, m.min, m.p95, m.mean)] + [cv]


def unstable_note(threshold: float) -> str:
    return (f"* unstable: coefficient of variation above {threshold:.0%}; "
            "use more rounds or a quieter machine")
