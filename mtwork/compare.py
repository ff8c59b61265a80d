"""A/B comparisons of kernel variants, reported as paired ratios (see `mtwork.timing` for
why rounds are interleaved and paired)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .display import TimeUnit, html_table, text_table
from .gpu.chips import Chip
from .gpu.model import Estimate
from .modelled import GpuChoice, chip_for, estimate_of, model_label, model_ratio
from .oracle import DiffReport, diff
from .recording import watching_calls
from .timing import (
    DEFAULT_CV_THRESHOLD,
    Clock,
    Measurement,
    Timed,
    Timer,
    check_counts,
    clock_for,
    on_backend,
    output_arrays,
    stat_cells,
    timed,
    unstable_note,
    yes_no,
)

__all__ = ["Comparison", "Ratio", "compare"]


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
    chip: Chip | None = None  # the chip the variants are modelled on (None: not modelled)
    estimates: dict[str, Estimate | None] = field(default_factory=dict)
    model_notes: dict[str, str] = field(default_factory=dict)  # why a variant has none
    # On metal: per variant, the launch cost of each round, measured apart.
    launch_times: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def modelled(self) -> bool:
        """Whether every variant has a modelled time (each a `Launch`)."""
        return self.chip is not None and all(self.estimates.get(n) for n in self.names)

    @property
    def ranked_by(self) -> str:
        """"modelled" on sim when every variant is modelled, else "measured"."""
        return "modelled" if self.modelled and self.clock.backend != "metal" else "measured"

    def ranked(self) -> list[str]:
        """The variants, fastest first: by modelled time on sim (the emulator's clock
        says nothing about GPU speed), by measured median time on metal."""
        if self.ranked_by == "modelled":
            modelled = {n: e.seconds for n, e in self.estimates.items() if e is not None}
            return sorted(self.names, key=modelled.__getitem__)
        medians = {n: m.median for n, m in self.measurements.items()}
        return sorted(self.names, key=medians.__getitem__)

    @property
    def modelled_speedups(self) -> dict[str, float]:
        """Baseline modelled time / variant modelled time, for the variants modelled."""
        base = self.estimates.get(self.baseline)
        return {n: base.seconds / e.seconds for n, e in self.estimates.items()
                if base is not None and e is not None and e.seconds > 0}

    def model_verdict(self) -> str:
        """Which variant the model expects to win on its chip, and by how much over the
        next one; or why it cannot say (no chip, a variant not modelled)."""
        if self.chip is None:
            return "not modelled (gpu=False)"
        if not self.modelled:
            missing = "; ".join(f"{n}: {why}" for n, why in self.model_notes.items())
            return f"the model cannot rank these on {self.chip.label}: {missing}"
        times = {n: e.seconds for n, e in self.estimates.items() if e is not None}
        first, second = sorted(self.names, key=times.__getitem__)[:2]
        return (f"on {self.chip.label} the model expects {first} to win: "
                f"{times[second] / times[first]:.2f}x faster than {second} "
                f"({self.estimates[first].bound}-bound against "
                f"{self.estimates[second].bound}-bound)")

    @property
    def model_errors(self) -> dict[str, float]:
        """Measured median / modelled time per variant: the model's error on a GPU clock."""
        out = {}
        for name, m in self.measurements.items():
            ratio = model_ratio(m.median, self.estimates.get(name))
            if ratio is not None:
                out[name] = ratio
        return out

    @property
    def rounds(self) -> int:
        return len(self.orders)

    @property
    def measurements(self) -> dict[str, Measurement]:
        return {
            name: Measurement.from_samples(
                self.round_times[name], clock=self.clock, name=name, warmup=self.warmup,
                cv_threshold=self.cv_threshold, launch=self.launch_times.get(name, ()),
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
        if self.chip is not None:
            lines.append(self._model_line())
        return lines

    def _model_line(self) -> str:
        assert self.chip is not None
        order = ", ".join(self.ranked())
        if self.ranked_by == "modelled":
            return f"ranked by {model_label(self.chip)}: {order}"
        if self.clock.backend == "metal":
            return (f"ranked by {self.clock.label}: {order}; beside it the "
                    f"{model_label(self.chip)}, and its error as measured / modelled")
        missing = "; ".join(f"{n}: {why}" for n, why in self.model_notes.items())
        return f"ranked by {self.clock.label}: {order} ({missing})"

    def _model_header(self) -> list[str]:
        if self.chip is None:
            return []
        last = ("measured / modelled" if self.clock.backend == "metal"
                else f"modelled speed-up vs {self.baseline}")
        return [f"modelled ({self.chip.name})", "bound", last]

    def _model_cells(self, name: str) -> list[str]:
        if self.chip is None:
            return []
        e = self.estimates.get(name)
        if e is None:
            return ["—", "—", "—"]
        if self.clock.backend == "metal":
            ratio = self.model_errors.get(name)
            last = "—" if ratio is None else f"{ratio:.3g}×"
        else:
            speedup = self.modelled_speedups.get(name)
            last = ("baseline" if name == self.baseline
                    else "—" if speedup is None else f"{speedup:.3g}×")
        return [TimeUnit.for_seconds(e.seconds).format(e.seconds), e.bound, last]

    def _rows(self) -> tuple[list[str], list[tuple[list[str], bool]]]:
        unit = TimeUnit.for_seconds(self.measurements[self.baseline].median)
        clock = "GPU" if self.clock.backend == "metal" else "emulator CPU"
        header = ["variant", f"{clock} median", "min", "p95", "mean", "CV",
                  f"speed-up vs {self.baseline}", *self._model_header()]
        if self.check:
            header.append(f"matches {self.baseline}")
        rows = []
        speedups = self.speedups
        measurements = self.measurements
        for name in self.ranked():
            m = measurements[name]
            cells = [name, *stat_cells(m, unit)]
            cells.append("baseline" if name == self.baseline else str(speedups[name]))
            cells += self._model_cells(name)
            if self.check:
                cells.append("—" if name == self.baseline else yes_no(self.agrees(name)))
            rows.append((cells, m.unstable))
        return header, rows

    def __str__(self) -> str:
        header, rows = self._rows()
        lines = self._lines() + [""] + text_table(header, [cells for cells, _ in rows])
        if any(unstable for _, unstable in rows):
            lines.append(unstable_note(self.cv_threshold))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        header, rows = self._rows()
        first, *rest = self._lines()
        unstable = [flag for _, flag in rows]
        return html_table(caption=first, lines=rest, header=header,
                          rows=[cells for cells, _ in rows], highlighted=unstable,
                          note=unstable_note(self.cv_threshold) if any(unstable) else "")


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
    gpu: GpuChoice = None,
) -> Comparison:
    """Time several variants in interleaved rounds and report paired speed-ups.

    Every round calls each variant once; round r starts with variant r mod n (for two
    variants: A,B then B,A, ...), warm-up included. `baseline` defaults to the first
    variant. `check="bitwise"` (or "close", the dtype's tolerance band) also diffs every
    variant's outputs against the baseline's, as in a bitwise A/B of two kernel layouts.
    Calls wait for their outputs, and `setup` runs before each, as in `bench`.

    Variants that are `Launch`es (or `LibraryLaunch`es) also run once with the profiler
    and are modelled on `gpu` (a chip name or `mtwork.gpu` chip; None: `MTWORK_GPU`,
    else the default chip; False: no model). On sim the table ranks them by modelled
    time, the emulator's CPU time beside it; on metal by measured GPU time, with the
    model's error (measured / modelled) beside it.
    """
    names = tuple(variants)
    if len(names) < 2:
        raise ValueError(f"compare needs at least two variants, got {len(names)}: {names}")
    baseline = names[0] if baseline is None else baseline
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {names}")
    if check not in (None, "bitwise", "close"):
        raise ValueError(f"check must be None, 'bitwise' or 'close', not {check!r}")
    check_counts(warmup, rounds)
    clock = clock_for(backend)
    timers, watched = _timers(variants, clock, timer, setup)
    clock = next(iter(timers.values())).clock
    calls = {n: timers[n] if n in watched else _FirstWatched(n, timers[n], watched)
             for n in names}

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
    chip = chip_for(gpu)
    estimates, notes = _modelled(variants, chip, watched)
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
        chip=chip,
        estimates=estimates,
        model_notes=notes,
        launch_times={n: tuple(t.launch[warmup:]) for n, t in timers.items() if t.launch},
    )


def _timers(variants: Mapping[str, Callable[[], Any]], clock: Clock, timer: Timer,
            setup: Callable[[], Any] | None) -> tuple[dict[str, Timed], dict[str, list[str]]]:
    """Each variant's timed call, all on one clock (per dispatch on metal only when every
    variant can be), and the kernels the variants a per-dispatch timer called once
    dispatched."""
    watched: dict[str, list[str]] = {}
    timers = {}
    for n, variant in variants.items():
        with watching_calls() as seen:  # a per-dispatch timer calls its variant once
            timers[n] = timed(on_backend(variant, clock.backend), clock, timer, setup)
        if seen:
            watched[n] = seen
    if len({t.clock for t in timers.values()}) > 1:  # paired ratios need one clock
        timers = {n: timed(on_backend(v, clock.backend), clock, timer, setup,
                           per_dispatch=False) for n, v in variants.items()}
    return timers, watched


@dataclass
class _FirstWatched:
    """A variant's timed call whose first run notes, in `watched`, the kernels it
    dispatches (how a plain callable is modelled without calling it again for nothing)."""

    name: str
    call: Callable[[], tuple[float, Any]]
    watched: dict[str, list[str]]

    def __call__(self) -> tuple[float, Any]:
        if self.name in self.watched:
            return self.call()
        with watching_calls() as seen:
            result = self.call()
        self.watched[self.name] = seen
        return result


def _modelled(variants: Mapping[str, Callable[[], Any]], chip: Chip | None,
              watched: Mapping[str, list[str]]
              ) -> tuple[dict[str, Estimate | None], dict[str, str]]:
    """Each variant profiled once and modelled on `chip`, and why one is not (a plain
    callable is called again only if its first call dispatched one kernel)."""
    estimates: dict[str, Estimate | None] = {}
    notes: dict[str, str] = {}
    if chip is not None:
        for name, variant in variants.items():
            _, estimates[name], note = estimate_of(variant, (), chip, watched.get(name))
            if note:
                notes[name] = note
    return estimates, notes


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


