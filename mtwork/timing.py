"""Honest timing: warm-up, repeated rounds, robust statistics, and A/B comparisons reported
as paired ratios.

Two habits make kernel timings trustworthy, and both are built in here:

* **Interleave and pair.** Absolute latency drifts a lot between rounds on a laptop GPU
  (thermal and clock changes; swings near 90% have been seen on an M5 Max), but two
  variants run back to back within one round see the same conditions. `compare` runs
  every variant once per round, rotates which one starts (so no variant always goes
  first, or always runs on a cache the other one warmed) and reports, per variant, the
  median and range of the per-round ratios `baseline / variant`, not a ratio of averages.
* **Say which clock.** On `metal` the clock brackets a call and the wait for its outputs
  (host wall time around a synchronised GPU call, so launch overhead is included); on
  `sim` it measures the CPU emulator, which says nothing about GPU speed. Every result
  carries a `Clock` whose label appears in every printout and plot.

Times are in seconds throughout; printouts pick a readable unit.
"""

from __future__ import annotations

import html
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx
import numpy as np

from .backends import resolve as resolve_backend
from .oracle import DiffReport, diff

CLOCK_LABELS = {
    "metal": "GPU time (metal)",
    "sim": "emulator CPU time (sim) — not GPU speed",
}
# Above this coefficient of variation a measurement is flagged unstable (metaltile uses 5%).
DEFAULT_CV_THRESHOLD = 0.05

Timer = Callable[[], float]


@dataclass(frozen=True)
class Clock:
    """What a time measures: GPU time on `metal`, emulator CPU time on `sim`."""

    backend: str

    @property
    def label(self) -> str:
        return CLOCK_LABELS[self.backend]

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
    ) -> Measurement:
        """Build a Measurement from times taken elsewhere (or made up, in tests)."""
        clock = Clock(clock) if isinstance(clock, str) else clock
        return cls(tuple(float(s) for s in samples), clock, name, warmup, cv_threshold)

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
            "clock": self.clock.label,
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
            clock=data["backend"],
            name=data.get("name"),
            warmup=data.get("warmup", 0),
            cv_threshold=data.get("cv_threshold", DEFAULT_CV_THRESHOLD),
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
        if self.unstable:
            parts.append(f"UNSTABLE: CV above {self.cv_threshold:.0%}")
        return "  ".join(parts)

    def __str__(self) -> str:
        head = f"{self.name}: " if self.name else ""
        return f"{head}{self.summary()}\n  [{self.clock.label}]"

    def _repr_html_(self) -> str:
        unit = TimeUnit.for_seconds(self.median)
        return _html_table(
            caption=(self.name + " — " if self.name else "") + self.clock.label,
            header=["median", "min", "p95", "mean", "CV", "rounds", "warm-up"],
            rows=[(_stat_cells(self, unit) + [str(self.rounds), str(self.warmup)],
                   self.unstable)],
            note=_unstable_note(self.cv_threshold) if self.unstable else "",
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
    `mx.synchronize()`. `backend` (default: the default backend) picks the clock label;
    it does not move `fn` to that backend, so run the kernel there yourself (or time a
    `mtwork.sweeps.Launch`, which is run on it). `setup()`, if given, runs untimed before
    every call: flush caches, or restore an output a kernel updates in place (what
    Triton's do_bench and `restore_value` do). `timer` is for tests.
    """
    _check_counts(warmup, rounds)
    clock = clock_for(backend)
    call = _timed(_on_backend(fn, clock.backend), clock, timer, setup)
    for _ in range(warmup):
        call()
    samples = [call()[0] for _ in range(rounds)]
    return Measurement.from_samples(
        samples, clock=clock, name=name, warmup=warmup, cv_threshold=cv_threshold
    )


# --- several variants ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """Per-round paired ratios `baseline time / variant time` (above 1: the variant is
    faster)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def __str__(self) -> str:
        return f"{self.median:.3g}× ({self.min:.3g}–{self.max:.3g})"


@dataclass(frozen=True)
class Comparison:
    """Variants timed in interleaved rounds; see `compare`."""

    clock: Clock
    baseline: str
    names: tuple[str, ...]
    orders: tuple[tuple[str, ...], ...]  # the call order of each timed round
    round_times: dict[str, tuple[float, ...]]  # per variant, one time per round
    warmup: int
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    check: str | None = None
    agreement: dict[str, list[DiffReport]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.orders)

    @property
    def measurements(self) -> dict[str, Measurement]:
        return {
            name: Measurement.from_samples(
                self.round_times[name], clock=self.clock, name=name, warmup=self.warmup,
                cv_threshold=self.cv_threshold,
            )
            for name in self.names
        }

    @property
    def speedups(self) -> dict[str, Ratio]:
        """Each variant's paired ratios against the baseline (the baseline's are all 1)."""
        base = self.round_times[self.baseline]
        return {
            name: Ratio(tuple(_ratio(b, t) for b, t in zip(base, self.round_times[name])))
            for name in self.names
        }

    def agrees(self, name: str) -> bool | None:
        """Whether `name`'s outputs matched the baseline's (None when not checked)."""
        if self.check is None:
            return None
        return all(report.ok for report in self.agreement[name])

    def _lines(self) -> list[str]:
        how = "starting side alternated" if len(self.names) == 2 else "starting variant rotated"
        lines = [
            f"Comparison of {len(self.names)} variants — {self.clock.label}",
            f"{self.rounds} interleaved rounds ({how}), {self.warmup} warm-up calls each; "
            f"speed-up = {self.baseline} time / variant time, paired within each round: "
            "median (min–max)",
        ]
        if self.check:
            lines.append(f"outputs checked against {self.baseline} ({self.check})")
        return lines

    def _rows(self) -> tuple[list[str], list[tuple[list[str], bool]]]:
        unit = TimeUnit.for_seconds(self.measurements[self.baseline].median)
        header = ["variant", "median", "min", "p95", "mean", "CV", f"speed-up vs {self.baseline}"]
        if self.check:
            header.append(f"matches {self.baseline}")
        rows = []
        speedups = self.speedups
        for name, m in self.measurements.items():
            cells = [name, *_stat_cells(m, unit)]
            cells.append("baseline" if name == self.baseline else str(speedups[name]))
            if self.check:
                cells.append("—" if name == self.baseline else _yes_no(self.agrees(name)))
            rows.append((cells, m.unstable))
        return header, rows

    def __str__(self) -> str:
        header, rows = self._rows()
        lines = self._lines() + [""] + _text_table(header, [cells for cells, _ in rows])
        if any(unstable for _, unstable in rows):
            lines.append(_unstable_note(self.cv_threshold))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        header, rows = self._rows()
        first, *rest = self._lines()
        note = "<br>".join(html.escape(line) for line in rest)
        if any(unstable for _, unstable in rows):
            note += "<br>" + html.escape(_unstable_note(self.cv_threshold))
        return _html_table(caption=first, header=header, rows=rows, note=note, escape_note=False)


def compare(
    variants: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 10,
    warmup: int = 3,
    baseline: str | None = None,
    backend: str | None = None,
    check: Literal["bitwise", "close"] | None = None,
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
    setup: Callable[[], Any] | None = None,
    timer: Timer = time.perf_counter,
) -> Comparison:
    """Time several variants in interleaved rounds and report paired speed-ups.

    Every round calls each variant once; round r starts with variant r mod n (for two
    variants: A,B then B,A, ...), warm-up included. `baseline` defaults to the first
    variant. `check="bitwise"` (or "close", the dtype's tolerance band) also diffs every
    variant's outputs against the baseline's, as in a bitwise A/B of two kernel layouts.
    Calls wait for their outputs, and `setup` runs before each, as in `bench`.
    """
    names = tuple(variants)
    if len(names) < 2:
        raise ValueError(f"compare needs at least two variants, got {len(names)}: {names}")
    baseline = names[0] if baseline is None else baseline
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    if check not in (None, "bitwise", "close"):
        raise ValueError(f"check must be None, 'bitwise' or 'close', not {check!r}")
    _check_counts(warmup, rounds)
    clock = clock_for(backend)
    calls = {
        n: _timed(_on_backend(variants[n], clock.backend), clock, timer, setup) for n in names
    }

    last_outputs: dict[str, Any] = {}
    for r in range(warmup):
        for name in _rotation(names, r):
            last_outputs[name] = calls[name]()[1]
    agreement = {}
    if check:  # before timing, so a mismatch in kind fails fast
        if not last_outputs:
            last_outputs = {name: calls[name]()[1] for name in names}
        for name in names:
            agreement[name] = _agreement(
                last_outputs[name], last_outputs[baseline], name, baseline, check == "bitwise"
            )

    orders, times = [], {name: [] for name in names}
    for r in range(rounds):
        order = _rotation(names, r)
        orders.append(order)
        for name in order:
            times[name].append(calls[name]()[0])
    return Comparison(
        clock=clock,
        baseline=baseline,
        names=names,
        orders=tuple(orders),
        round_times={name: tuple(ts) for name, ts in times.items()},
        warmup=warmup,
        cv_threshold=cv_threshold,
        check=check,
        agreement=agreement,
    )


def _ratio(base: float, variant: float) -> float:
    if variant > 0:
        return base / variant
    return 1.0 if base == variant else math.inf  # a timer too coarse to see the call


def _rotation(names: tuple[str, ...], r: int) -> tuple[str, ...]:
    k = r % len(names)
    return names[k:] + names[:k]


def _agreement(
    outputs: Any, reference: Any, name: str, baseline: str, bitwise: bool
) -> list[DiffReport]:
    ours, theirs = output_arrays(outputs), output_arrays(reference)
    if len(ours) != len(theirs):
        raise ValueError(
            f"variant {name!r} returned {len(ours)} arrays but {baseline!r} returned "
            f"{len(theirs)}; compared variants must return the same outputs"
        )
    reports = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        try:
            reports.append(diff(a, b, bitwise=bitwise, name=f"{name}[{i}] vs {baseline}[{i}]"))
        except ValueError as exc:
            raise ValueError(
                f"output {i} of variant {name!r} cannot be compared with {baseline!r}'s: {exc}"
            ) from None
    return reports


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


def _timed(
    fn: Callable[[], Any], clock: Clock, timer: Timer, setup: Callable[[], Any] | None
) -> Callable[[], tuple[float, Any]]:
    def call() -> tuple[float, Any]:
        if setup is not None:
            wait_for(setup(), clock.backend)
        start = timer()
        outputs = fn()
        wait_for(outputs, clock.backend)
        return timer() - start, outputs

    return call


def _on_backend(fn: Callable[[], Any], backend: str) -> Callable[[], Any]:
    """A `Launch` is run on the clock's backend, so the label is true for it."""
    from .sweeps import Launch  # sweep imports this module

    if isinstance(fn, Launch):
        return lambda: fn(backend=backend)
    return fn


def _check_counts(warmup: int, rounds: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")


# --- formatting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeUnit:
    name: str
    scale: float  # seconds per unit

    @classmethod
    def for_seconds(cls, seconds: float) -> TimeUnit:
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
            if seconds >= scale:
                return cls(name, scale)
        return cls("ns", 1e-9)

    def format(self, seconds: float) -> str:
        return f"{seconds / self.scale:.4g} {self.name}"


def _format_cv(cv: float | None) -> str:
    return "n/a" if cv is None else f"{cv:.1%}"


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "—"}[value]


def _stat_cells(m: Measurement, unit: TimeUnit) -> list[str]:
    cv = _format_cv(m.cv) + ("*" if m.unstable else "")
    return [unit.format(x) for x in (m.median, m.min, m.p95, m.mean)] + [cv]


def _unstable_note(threshold: float) -> str:
    return (f"* unstable: coefficient of variation above {threshold:.0%}; "
            "use more rounds or a quieter machine")


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*row).rstrip() for row in rows]


_CELL = "padding:2px 8px;text-align:left;border-bottom:1px solid #ddd"
_UNSTABLE_BG = "#fff3cd"


def _html_table(
    *,
    caption: str,
    header: Sequence[str],
    rows: Sequence[tuple[Sequence[str], bool]],
    note: str = "",
    escape_note: bool = True,
) -> str:
    """A small HTML table; rows flagged True are highlighted as unstable."""
    head = "".join(f'<th style="{_CELL}">{html.escape(h)}</th>' for h in header)
    body = []
    for cells, flagged in rows:
        style = f"{_CELL};background:{_UNSTABLE_BG}" if flagged else _CELL
        body.append("<tr>" + "".join(f'<td style="{style}">{html.escape(c)}</td>'
                                     for c in cells) + "</tr>")
    note_html = html.escape(note) if escape_note else note
    foot = f'<div style="font-size:0.85em;color:#555">{note_html}</div>' if note else ""
    return (
        '<div style="font-family:sans-serif;font-size:0.9em">'
        f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(caption)}</div>'
        f'<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}</table>'
        f"{foot}</div>"
    )
