"""Honest GPU time on `metal`, proved off a Mac with `sim` standing in for MLX (what is in
the timed region, not its speed): each program's kernel object is made once; a call that
dispatches one kernel is timed per dispatch, from batches of back-to-back dispatches
evaluated at once, with no kernel object made and no buffer copied inside the clock, and
its launch cost comes back apart; a call of several kernels is timed whole, and the
clock's label says which."""

from __future__ import annotations

import importlib

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import batched, timing
from mtwork.backends import register
from mtwork.backends.metal import MetalBackend
from mtwork.compare import compare
from mtwork.timing import bench

SOURCE = "uint i = thread_position_in_grid.x;\nout[i] = inp[i] * 2.0f;"
LIBRARY = """
#include <metal_stdlib>
using namespace metal;
[[kernel]] void twice(device const float* inp [[buffer(0)]], device float* out [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
    out[i] = inp[i] * 2.0f;
}
"""


class StandIn:
    """`mx.fast.metal_kernel` played by `mtwork.metal_kernel` on sim, in process, with a
    log of kernel objects made and dispatches."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __call__(self, **arguments):
        self.log.append("make kernel")
        kernel = mtwork.metal_kernel(**arguments, backend="sim")

        def dispatch(**call):
            # sim's calls are operations of MLX's graph: evaluated here, so that the
            # stand-in's own dispatch is part of this one, as MLX's kernel has none.
            self.log.append("dispatch")
            results = kernel(**call, isolate=False)
            mx.eval(results)
            return results

        return dispatch


class MetalHere(MetalBackend):
    def unavailable_reason(self) -> str | None:
        return None


@pytest.fixture
def log(monkeypatch) -> list[str]:
    """The stand-in registered as `metal` (restored after), the clocks on metal, and a log
    of what happens: clock reads, evaluations (with their dispatch count), kernel objects
    made, dispatches, and the host copies a call does."""
    events: list[str] = []
    register("metal", lambda: MetalHere(make_kernel=StandIn(events)))
    monkeypatch.setattr(timing, "resolve_backend", lambda name: "metal")
    real_eval = mx.eval

    def logged_eval(*arrays):
        events.append(f"eval {len(arrays[0]) if arrays and isinstance(arrays[0], list) else 1}")
        real_eval(*arrays)

    monkeypatch.setattr(batched.mx, "eval", logged_eval)
    monkeypatch.setattr(batched.mx, "synchronize", lambda *a: events.append("sync"))
    metal = importlib.import_module("mtwork.backends.metal")
    for name in ("to_mx", "allocate", "numpy_view"):
        real = getattr(metal, name)
        monkeypatch.setattr(metal, name, _logged(events, f"copy ({name})", real))
    yield events
    register("metal", "mtwork.backends.metal:MetalBackend")


def _logged(events, what, fn):
    def call(*args, **kwargs):
        events.append(what)
        return fn(*args, **kwargs)

    return call


def _clock(events: list[str]):
    def read() -> float:
        events.append("clock")
        return 0.0

    return read


def _timed_regions(events: list[str]) -> list[list[str]]:
    starts = [i for i, e in enumerate(events) if e == "clock"][::2]
    return [events[i + 1: events.index("clock", i + 1)] for i in starts]


def _launch(n: int = 64) -> mtwork.Launch:
    kernel = mtwork.metal_kernel("twice", ["inp"], ["out"], SOURCE)
    return mtwork.Launch(kernel, grid=(n, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(n,)],
                         output_dtypes=[mx.float32], inputs=[mx.arange(n, dtype=mx.float32)])


def test_a_programs_kernel_object_is_made_once(log) -> None:
    launch = _launch()
    for _ in range(3):
        out = launch(backend="metal")[0]
        assert np.array_equal(np.array(out), 2 * np.arange(64))
    assert log.count("make kernel") == 1 and log.count("dispatch") == 3
    _launch(32)(backend="metal")  # another grid, the same program
    assert log.count("make kernel") == 1
    other = mtwork.metal_kernel("thrice", ["inp"], ["out"], SOURCE.replace("2.0f", "3.0f"))
    other(inputs=[mx.ones(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[mx.float32], backend="metal")
    assert log.count("make kernel") == 2


@pytest.mark.parametrize("form", ["body", "library"])
def test_the_clock_brackets_batches_of_dispatches_and_nothing_else(log, form) -> None:
    if form == "body":
        fn = _launch()
    else:
        kernel = mtwork.load_metal(LIBRARY).kernel("twice")
        fn = kernel.launch(buffers={"inp": np.arange(64, dtype=np.float32),
                                    "out": mtwork.new_buffer(64)}, grid=64,
                           threads_per_threadgroup=32)
    m = bench(fn, warmup=1, rounds=2, backend="metal", timer=_clock(log))
    assert "per dispatch" in m.clock.label and "launch cost apart" in m.clock.label
    regions = _timed_regions(log)
    # Each round: one dispatch evaluated, then a batch, each alone in the clock.
    assert regions == [["eval 1", "sync"], [f"eval {batched.BATCH}", "sync"]] * 3
    assert log.count("make kernel") == 1
    first_clock = log.index("clock")
    assert not [e for e in log[first_clock:] if e.startswith("copy")]  # copies came before
    # Every dispatch of a batch was made (lazily, untimed) just before its evaluation.
    clocks = [i for i, e in enumerate(log) if e == "clock"]
    for start, end, expected in zip(clocks[1::2], clocks[2::2], [batched.BATCH, 1] * 3):
        assert log[start:end].count("dispatch") == expected


def test_time_per_dispatch_is_the_slope_and_the_launch_cost_comes_apart(log, monkeypatch):
    per_dispatch, launch = 20e-6, 150e-6
    now = [0.0]
    real_eval = batched.mx.eval

    def evaluation(results):  # a GPU: a launch cost per evaluation, then each dispatch
        now[0] += launch + per_dispatch * len(results)
        real_eval(results)

    monkeypatch.setattr(batched.mx, "eval", evaluation)
    m = bench(_launch(), warmup=1, rounds=3, backend="metal", timer=lambda: now[0])
    assert m.samples == pytest.approx([per_dispatch] * 3)
    assert m.launch == pytest.approx([launch] * 3)
    assert "launch cost" in m.summary()
    assert mtwork.Measurement.from_dict(m.to_dict()) == m


def test_a_call_of_two_kernels_is_timed_whole_and_labelled_so(log) -> None:
    first, second = _launch(), _launch(32)
    m = bench(lambda: [first(backend="metal"), second(backend="metal")], warmup=0, rounds=1,
              backend="metal", timer=_clock(log))
    assert m.clock.label.endswith(batched.WHOLE_CALL) and m.launch == ()
    assert "dispatch" in _timed_regions(log)[0]  # the whole call is inside the clock


def test_compare_times_every_variant_the_same_way(log) -> None:
    a, b = _launch(), _launch(32)
    c = compare({"a": a, "b": b}, rounds=1, warmup=0, gpu=False, timer=_clock(log))
    assert "per dispatch" in c.clock.label
    assert set(c.launch_times) == {"a", "b"}
    mixed = compare({"a": a, "two": lambda: [a(backend="metal"), b(backend="metal")]},
                    rounds=1, warmup=0, gpu=False, timer=_clock(log))
    assert mixed.clock.method == batched.WHOLE_CALL and not mixed.launch_times


def test_a_sweep_on_metal_says_its_times_are_per_dispatch(log) -> None:
    kernel = mtwork.metal_kernel("twice", ["inp"], ["out"], SOURCE)
    x = mx.arange(64, dtype=mx.float32)

    def build(config):
        return mtwork.Launch(kernel, grid=(64, 1, 1), threadgroup=(config["tg"], 1, 1),
                             output_shapes=[(64,)], output_dtypes=[mx.float32])

    result = mtwork.sweep(build, {"tg": [16, 32]}, inputs=[x], oracle=lambda a: 2 * np.array(a),
                          backend="metal", rounds=2, warmup=0, progress=False, gpu=False)
    assert [r.status for r in result.records] == ["ok", "ok"]
    assert result.clock.method == batched.PER_DISPATCH
    assert all(len(r.measurement.launch) == 2 for r in result.records)
