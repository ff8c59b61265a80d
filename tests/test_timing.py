"""Timing statistics, interleaving and paired ratios, on scripted clocks and real calls."""

import json
import statistics
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import timing
from mtwork.compare import Comparison, compare
from mtwork.timing import Clock, Measurement, bench

SIM_LABEL = "emulator CPU time (sim) — not GPU speed"


class FakeClock:
    """A timer that moves only when a timed function says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scripted(clock: FakeClock, durations: list[float]):
    """A function whose n-th call takes durations[n] seconds of fake time."""
    calls = iter(durations)

    def fn() -> None:
        clock.advance(next(calls))

    return fn


# --- bench -----------------------------------------------------------------------------------


def test_bench_drops_warmup_and_keeps_every_sample() -> None:
    clock = FakeClock()
    fn = scripted(clock, [9.0, 8.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    m = bench(fn, warmup=2, rounds=5, timer=clock)
    assert m.samples == (1.0, 5.0, 2.0, 4.0, 3.0)
    assert (m.min, m.median, m.mean) == (1.0, 3.0, 3.0)
    assert m.p95 == pytest.approx(np.percentile([1, 2, 3, 4, 5], 95))
    assert m.stdev == pytest.approx(statistics.stdev([1, 2, 3, 4, 5]))
    assert m.cv == pytest.approx(m.stdev / 3.0)
    assert (m.warmup, m.rounds) == (2, 5)


def test_bench_stops_the_clock_after_the_outputs_are_evaluated(monkeypatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(mx, "eval", lambda *a: events.append("eval"))

    def timer() -> float:
        events.append("clock")
        return 0.0

    def fn():
        events.append("fn")
        return [mx.array([1.0]), {"b": mx.array([2.0])}]

    bench(fn, warmup=0, rounds=1, backend="sim", timer=timer)
    assert events == ["clock", "fn", "eval", "clock"]


def test_metal_clock_also_synchronizes_before_stopping(monkeypatch) -> None:
    """On metal the clock must wait for the GPU: eval the outputs, then synchronize."""
    events: list[str] = []
    monkeypatch.setattr(timing, "resolve_backend", lambda name: "metal")
    monkeypatch.setattr(mx, "eval", lambda *a: events.append("eval"))
    monkeypatch.setattr(mx, "synchronize", lambda *a: events.append("sync"))

    def timer() -> float:
        events.append("clock")
        return 0.0

    m = bench(lambda: mx.array([1.0]), warmup=0, rounds=1, backend="metal", timer=timer)
    # Run once untimed first (it dispatches no kernel: timed as a whole call).
    assert events == ["eval", "sync", "clock", "eval", "sync", "clock"]
    assert m.clock.label == "GPU time (metal): whole call: host work, copies and launch included"


def test_setup_runs_before_every_call_and_is_not_timed() -> None:
    clock = FakeClock()
    flushes = []

    def flush() -> None:
        flushes.append(clock.now)
        clock.advance(100.0)  # a slow cache flush must not show up in the samples

    m = bench(scripted(clock, [1.0, 2.0, 3.0]), warmup=1, rounds=2, setup=flush, timer=clock)
    assert m.samples == (2.0, 3.0)
    assert len(flushes) == 3


def test_bench_of_a_real_function_has_consistent_statistics() -> None:
    m = bench(lambda: time.sleep(0.001), warmup=1, rounds=4)
    assert m.rounds == 4 and all(s > 0 for s in m.samples)
    assert m.min <= m.median <= m.p95 <= max(m.samples)
    assert m.clock == Clock("sim")  # tests run on sim


def test_every_printout_names_the_emulator_clock() -> None:
    m = Measurement.from_samples([1e-3, 1.1e-3], clock="sim", name="scale")
    assert m.clock.label == SIM_LABEL
    assert SIM_LABEL in str(m)
    assert SIM_LABEL in m._repr_html_()


def test_metal_clock_is_refused_where_there_is_no_gpu() -> None:
    if mtwork.backends()["metal"] is None:
        pytest.skip("this machine has a Metal GPU")
    with pytest.raises(mtwork.BackendUnavailable):
        bench(lambda: None, backend="metal", rounds=1)


@pytest.mark.parametrize(
    ("samples", "threshold", "unstable"),
    [
        ([1.0, 1.0, 1.0, 1.0], 0.05, False),
        ([1.0, 1.2, 0.8, 1.0, 1.0], 0.05, True),  # CV about 14%
        ([1.0, 1.2, 0.8, 1.0, 1.0], 0.20, False),
        ([1.0], 0.05, False),  # one sample has no spread to judge
    ],
)
def test_unstable_when_cv_exceeds_threshold(samples, threshold, unstable) -> None:
    m = Measurement.from_samples(samples, clock="sim", cv_threshold=threshold)
    assert m.unstable is unstable
    assert ("UNSTABLE" in str(m)) is unstable
    if len(samples) == 1:
        assert m.cv is None and "CV n/a" in str(m)


def test_measurement_round_trips_through_json() -> None:
    m = Measurement.from_samples([3e-6, 1e-6, 2e-6], clock="sim", name="k", warmup=2)
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert back.median == 2e-6


def test_bench_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="rounds"):
        bench(lambda: None, rounds=0)
    with pytest.raises(ValueError, match="warmup"):
        bench(lambda: None, warmup=-1)


# --- compare ----------------------------------------------------------------------------------


def drifting_pair(clock: FakeClock, slow: float, fast: float):
    """Two variants whose speed drifts 10x from round to round (think thermals) but whose
    ratio within a round is fixed. A round is one call of each."""
    calls = {"n": 0}

    def make(cost: float):
        def fn() -> None:
            round_index = calls["n"] // 2
            calls["n"] += 1
            clock.advance(cost * (1 + 9 * (round_index % 2)))

        return fn

    return make(slow), make(fast)


def test_paired_ratios_cancel_drift_between_rounds() -> None:
    clock = FakeClock()
    base, patched = drifting_pair(clock, slow=2.0, fast=1.0)
    c = compare({"base": base, "patched": patched}, rounds=6, warmup=2, timer=clock)
    ratio = c.speedups["patched"]
    assert ratio.samples == pytest.approx([2.0] * 6)
    assert (ratio.min, ratio.median, ratio.max) == pytest.approx((2.0, 2.0, 2.0))
    # The absolute times swing 10x, so the per-variant spread is large...
    assert c.measurements["base"].unstable
    # ...and each ratio comes from one round's pair, which the record lets us re-derive.
    for r in range(c.rounds):
        assert c.round_times["base"][r] / c.round_times["patched"][r] == ratio.samples[r]
    assert c.speedups["base"].samples == (1.0,) * 6


def test_two_variants_alternate_the_starting_side() -> None:
    clock = FakeClock()
    order: list[str] = []
    variants = {name: (lambda n=name: order.append(n)) for name in ("a", "b")}
    c = compare(variants, rounds=4, warmup=1, timer=clock)
    assert c.orders == (("a", "b"), ("b", "a"), ("a", "b"), ("b", "a"))
    assert order == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_three_variants_rotate_the_starting_side() -> None:
    c = compare({"a": lambda: None, "b": lambda: None, "c": lambda: None}, rounds=4, warmup=0,
                timer=FakeClock())
    assert c.orders == (("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c"))
    assert all(len(c.round_times[n]) == 4 for n in "abc")


def test_baseline_can_be_any_variant() -> None:
    clock = FakeClock()
    slow, fast = drifting_pair(clock, slow=3.0, fast=1.0)
    c = compare({"slow": slow, "fast": fast}, baseline="fast", rounds=4, warmup=0, timer=clock)
    assert c.speedups["slow"].median == pytest.approx(1 / 3)
    assert "speed-up vs fast" in str(c)


def test_bitwise_check_against_the_baseline() -> None:
    x = mx.arange(16, dtype=mx.float32) / 7
    variants = {
        "times two": lambda: [x * 2],
        "x plus x": lambda: [x + x],  # the same bits
        "off by a bit": lambda: [x * 2 + 1e-6],
    }
    c = compare(variants, rounds=2, warmup=1, check="bitwise", timer=FakeClock())
    assert c.agrees("x plus x") is True
    assert c.agrees("off by a bit") is False
    assert c.agreement["off by a bit"][0].bitwise
    text = str(c)
    assert "matches times two" in text and "NO" in text


def test_check_fails_fast_on_outputs_that_cannot_be_compared() -> None:
    calls = []

    def short():
        calls.append(1)
        return mx.zeros((3,))

    with pytest.raises(ValueError, match="cannot be compared"):
        compare({"long": lambda: mx.zeros((4,)), "short": short}, rounds=50, warmup=0,
                check="close", timer=FakeClock())
    assert len(calls) == 1  # it stopped before the timed rounds


def test_comparison_printouts_show_clock_and_method() -> None:
    clock = FakeClock()
    base, patched = drifting_pair(clock, slow=2e-3, fast=1e-3)
    c = compare({"base": base, "patched": patched}, rounds=4, warmup=0, timer=clock)
    text = str(c)
    assert SIM_LABEL in text
    assert "interleaved rounds" in text and "paired" in text
    assert "2× (2–2)" in text
    assert SIM_LABEL in c._repr_html_()
    assert isinstance(c, Comparison)


def test_compare_needs_two_variants_and_a_known_baseline() -> None:
    with pytest.raises(ValueError, match="at least two"):
        compare({"a": lambda: None})
    with pytest.raises(ValueError, match="baseline"):
        compare({"a": lambda: None, "b": lambda: None}, baseline="c")
