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
from .oracle import DiffReport, diff
from .timing import (
    DEFAULT_CV_THRESHOLD,
    Clock,
    Measurement,
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
            cells = [name, *stat_cells(m, unit)]
            cells.append("baseline" if name == self.baseline else str(speedups[name]))
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
    check_counts(warmup, rounds)
    clock = clock_for(backend)
    calls = {
        n: timed(on_backend(variants[n], clock.backend), clock, timer, setup) for n in names
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


