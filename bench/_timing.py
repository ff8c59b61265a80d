"""Interleaved timing shared by the benchmarks.

Every side runs once per round and the side that starts rotates (for two sides: A,B then
B,A), so drift in the machine's speed between rounds reaches all sides alike; results are
paired ratios per round, reported as median and range.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Check = Callable[[str, Any], None]


def interleaved_times(sides: Mapping[str, Callable[[], Any]], rounds: int, *,
                      check: Check | None = None, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each side's call, one per round; round r starts with side r mod n.

    `check(name, result)` runs after the warmup calls and the last round's, outside the
    timed window, so a side whose output is wrong fails the benchmark instead of looking
    fast. Not after every call: a check of a large output (mtwork.diff of 16M floats
    makes several float64 copies) slowed the call after it up to fourfold on this kind of
    virtual machine, though nothing in the process faulted."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            result = sides[name]()
            if check:
                check(name, result)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            result = sides[name]()
            times[name].append(time.perf_counter() - start)
            if check and r == rounds - 1:
                check(name, result)
            del result  # free a large output before the next side runs
    return times


def evaluated(outputs: Any) -> Any:
    """A kernel call's outputs, evaluated: a call is an operation of MLX's graph, which
    runs when MLX evaluates it, so a timed call must evaluate what it returns."""
    import mlx.core as mx

    mx.eval(outputs)
    return outputs


def interleaved(a: Callable[[], object], b: Callable[[], object], rounds: int) -> list[float]:
    """Ratios time(a) / time(b), one per round, the side that starts alternating."""
    times = interleaved_times({"a": a, "b": b}, rounds)
    return paired(times["a"], times["b"])


def paired(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-round ratios of two sides timed in the same rounds."""
    return [n / d for n, d in zip(numerator, denominator)]


@dataclass(frozen=True)
class Spread:
    """The median of per-round values, with their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def ratio_text(self) -> str:
        return f"{_number(self.median)}x [{_number(self.low)}, {_number(self.high)}]"

    def time_text(self) -> str:
        return seconds_text(self.median)


def _number(x: float) -> str:
    """Three significant digits, without an exponent for large values."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def seconds_text(seconds: float) -> str:
    """A duration in a readable unit: 812 us, 43.1 ms, 2.05 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
