"""The emulator's fast engine, as a kernel author meets it: which engine ran (and why),
the same bytes as the fiber engine, and the way back to fibers where threads of a group
do not reach the same barrier, the kernel faults or goes over its threadgroup memory.

The kernels run in this process (isolate=False): $MTWORK_SIM_ENGINE, set per test, is
read where the dispatch runs.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
import uuid

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends import get as backend
from mtwork.backends.sim import engine as sim_engine
from mtwork.backends.sim.engine import EngineMismatch
from mtwork.backends.sim.engine.build import build
from mtwork.errors import KernelFault, ThreadgroupMemoryError

RNG = np.random.default_rng(7)

TREE_SUM = """
    threadgroup float partial[256];
    uint t = thread_position_in_threadgroup.x;
    partial[t] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.x] = partial[0];
"""

# Per SIMD-group sums into threadgroup memory, then SIMD-group 0 alone sums those: a
# SIMD-group function only some SIMD-groups reach, between barriers.
TWO_LEVEL_SUM = """
    threadgroup float sums[8];
    uint t = thread_index_in_threadgroup;
    float v = simd_sum(inp[thread_position_in_grid.x]);
    if (thread_index_in_simdgroup == 0) sums[simdgroup_index_in_threadgroup] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (simdgroup_index_in_threadgroup == 0) {
        float w = thread_index_in_simdgroup < 8 ? sums[thread_index_in_simdgroup] : 0.0f;
        w = simd_sum(w);
        if (t == 0) out[threadgroup_position_in_grid.x] = w;
    }
"""


def call(kernel: mtwork.MetalKernel, x: np.ndarray, groups: int, threads: int = 256,
         **extra) -> np.ndarray:
    (out,) = kernel(inputs=[mx.array(x)], grid=(x.size, 1, 1), threadgroup=(threads, 1, 1),
                    output_shapes=[(groups,)], output_dtypes=[mx.float32], isolate=False,
                    **extra)
    return np.array(out)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch):
    """Sets $MTWORK_SIM_ENGINE for the test."""
    return lambda mode: monkeypatch.setenv("MTWORK_SIM_ENGINE", mode)


def test_a_kernel_with_barriers_runs_on_the_fast_engine(engine) -> None:
    x = RNG.standard_normal(64 * 256).astype(np.float32)
    kernel = mtwork.metal_kernel("engine_tree", ["inp"], ["out"], TREE_SUM)
    engine("fibers")
    reference = call(kernel, x, 64)
    assert kernel.last_engine.name == "fibers"
    assert kernel.last_engine.reason == "$MTWORK_SIM_ENGINE=fibers"
    engine("fast")
    fast = call(kernel, x, 64)
    assert kernel.last_engine.name == "fast" and kernel.last_engine.reason is None
    assert fast.tobytes() == reference.tobytes()
    np.testing.assert_allclose(fast, x.reshape(64, 256).astype(np.float64).sum(1), rtol=1e-5,
                               atol=1e-5)


def test_simd_group_functions_some_simdgroups_reach(engine) -> None:
    engine("compare")  # the fiber engine runs it again and the bytes must agree
    x = RNG.standard_normal(32 * 256).astype(np.float32)
    kernel = mtwork.metal_kernel("engine_two_level", ["inp"], ["out"], TWO_LEVEL_SUM)
    out = call(kernel, x, 32)
    assert kernel.last_engine.name == "fast"
    assert kernel.last_engine.reason == "compared with fibers"
    np.testing.assert_allclose(out, x.reshape(32, 256).astype(np.float64).sum(1), rtol=1e-5,
                               atol=1e-5)


def test_compare_mode_names_the_first_difference(engine) -> None:
    # Tickets handed out by an atomic counter depend on the order threads run in, which
    # differs between the engines (on the GPU, from run to run): compare mode sees it.
    engine("compare")
    kernel = mtwork.metal_kernel("engine_tickets", ["inp"], ["out"], """
        threadgroup atomic_uint counter;
        if (thread_index_in_threadgroup == 0)
            atomic_store_explicit(&counter, 0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = float(
            atomic_fetch_add_explicit(&counter, 1u, memory_order_relaxed) + inp[0]);
    """)
    with pytest.raises(EngineMismatch, match=r"`engine_tickets`: buffer 1 differs .* first at"):
        mx.eval(kernel(inputs=[mx.zeros((1,))], grid=(256, 1, 1), threadgroup=(256, 1, 1),
                       output_shapes=[(256,)], output_dtypes=[mx.float32], isolate=False))


# Two SIMD-groups each load an 8x8 tile: one from device memory (nothing written around
# it, so the fast engine runs it lane by lane), one from threadgroup memory its lanes have
# just written with no barrier, which only works if the load waits for every lane. The
# writes go through another name than the load reads, which the source-level lockstep
# check (lockstep.py) does not pair, so the kernel stays on the fast engine and the pass's
# own check must keep that load a meeting of the lanes.
TILE_LOADS = """
    threadgroup float tile[2][64];
    threadgroup float* scratch = tile[1];
    uint lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
    simdgroup_float8x8 m;
    if (sg == 0) {
        simdgroup_load(m, inp);
    } else {
        scratch[lane] = inp[lane] + 1.0f;
        scratch[lane + 32] = inp[lane + 32] + 1.0f;
        simdgroup_load(m, tile[1]);
    }
    simdgroup_store(m, out + 64 * sg);
"""


def test_tile_loads_run_lane_by_lane_only_where_no_lane_writes_around_them(engine) -> None:
    engine("compare")
    x = RNG.standard_normal(64).astype(np.float32)
    kernel = mtwork.metal_kernel("engine_tile_loads", ["inp"], ["out"], TILE_LOADS)
    (out,) = kernel(inputs=[mx.array(x)], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                    output_shapes=[(128,)], output_dtypes=[mx.float32], isolate=False)
    mx.eval(out)
    assert kernel.last_engine.name == "fast"
    out = np.array(out)
    np.testing.assert_array_equal(out[:64], x)
    np.testing.assert_array_equal(out[64:], x + np.float32(1))


EARLY_RETURN = """
    threadgroup float tile[256];
    uint t = thread_position_in_threadgroup.x, i = thread_position_in_grid.x;
    if (i >= n[0]) return;
    tile[t] = inp[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = tile[t] + tile[t ^ 1];
"""


def test_threads_that_return_before_a_barrier_send_the_kernel_to_fibers(engine) -> None:
    # Threads past the end return before the barrier; on Apple GPUs the others still go
    # through it (the fiber engine follows), which the fast engine does not model.
    engine("fast")
    kernel = mtwork.metal_kernel("engine_early_return", ["inp", "n"], ["out"], EARLY_RETURN)
    x = RNG.standard_normal(512).astype(np.float32)

    def run(n: int) -> np.ndarray:
        (out,) = kernel(inputs=[mx.array(x), mx.array([n], dtype=mx.uint32)],
                        grid=(512, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(512,)],
                        output_dtypes=[mx.float32], init_value=0, isolate=False)
        return np.array(out)

    full = run(512)  # every thread reaches the barrier
    assert kernel.last_engine.name == "fast"
    np.testing.assert_array_equal(full, x + x.reshape(-1, 2)[:, ::-1].reshape(-1))
    part = run(300)
    assert kernel.last_engine.name == "fibers"
    assert "did not all reach the same barrier" in kernel.last_engine.reason
    np.testing.assert_array_equal(part[:300], full[:300])
    np.testing.assert_array_equal(part[300:], 0)
    run(512)  # remembered: no fast attempt again
    assert kernel.last_engine.name == "fibers"
    assert kernel.last_engine.reason.endswith("it runs on fibers from now on")


# Row sums of exp in three passes: the innermost loop is a float reduction that only
# reads, so the fast engine runs each of its iterations for all threads at once (engine/
# loops.py). With rows of 1000 floats, threads 0..231 go round it four times and the
# others three, so they part at the loop's head and each runs on alone to the barrier,
# through passes that start again at that head; `scale` is the same in every thread, kept
# per thread across the loop's head all the same.
PASSES = """
    threadgroup float part[256];
    uint t = thread_position_in_threadgroup.x;
    const device float* x = inp + threadgroup_position_in_grid.y * N;
    float total = 0.0f;
    for (uint pass = 0; pass < 3; ++pass) {
        float scale = 0.25f * float(pass + 1);
        float s = 0.0f;
        for (uint j = t; j < N; j += 256) s += metal::exp(x[j] * scale);
        total += s * scale;
    }
    part[t] = total;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.y] = part[0];
"""


@pytest.mark.parametrize("columns", [1024, 1000])
def test_reduction_loops_run_an_iteration_at_a_time_and_part_where_trip_counts_differ(
        engine, columns: int) -> None:
    engine("compare")  # the fiber engine runs it again and the bytes must agree
    x = RNG.standard_normal((8, columns)).astype(np.float32)
    kernel = mtwork.metal_kernel("engine_passes", ["inp"], ["out"], PASSES)
    (out,) = kernel(inputs=[mx.array(x)], template=[("N", columns)], grid=(256, 8, 1),
                    threadgroup=(256, 1, 1), output_shapes=[(8,)], output_dtypes=[mx.float32],
                    isolate=False)
    mx.eval(out)
    assert kernel.last_engine.name == "fast"
    wide = x.astype(np.float64)
    expected = sum(np.exp(wide * 0.25 * k).sum(1) * 0.25 * k for k in (1, 2, 3))
    np.testing.assert_allclose(np.array(out), expected, rtol=1e-5)


def test_a_fault_is_reported_by_the_fiber_engine(engine) -> None:
    engine("fast")
    kernel = mtwork.metal_kernel("engine_fault", ["inp"], ["out"], """
        threadgroup float tile[64];
        uint t = thread_position_in_threadgroup.x;
        tile[t] = inp[thread_position_in_grid.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        device float* nowhere = (device float*)(ulong(tile[0] == tile[0]) * 16);
        if (t == 5) nowhere[t] = 1.0f;
        out[thread_position_in_grid.x] = tile[63 - t];
    """)
    with pytest.raises(KernelFault, match=r"thread_position_in_threadgroup \(5,0,0\)"):
        call(kernel, np.ones(64, np.float32), 64, threads=64)


def test_threadgroup_memory_over_budget_is_reported_as_on_fibers(engine) -> None:
    engine("fast")
    kernel = mtwork.metal_kernel("engine_big_tile", ["inp"], ["out"], """
        threadgroup float tile[9000];
        tile[thread_position_in_threadgroup.x] = inp[thread_position_in_grid.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[thread_position_in_grid.x] = tile[0];
    """)
    with pytest.raises(ThreadgroupMemoryError, match="over budget"):
        call(kernel, np.ones(64, np.float32), 64, threads=64)


def test_a_kernel_the_pass_cannot_take_says_why(engine) -> None:
    # A recursive helper (Metal has recursion in kernels from MSL 2.4) keeps clang from
    # inlining everything into the per-thread entry, so the pass cannot see where the
    # kernel's barriers are.
    engine("fast")
    kernel = mtwork.metal_kernel("engine_recursion", ["inp"], ["out"], """
        threadgroup float tile[32];
        uint t = thread_position_in_threadgroup.x;
        tile[t] = inp[t] * float(1 + fibonacci(int(inp[t]) % 2));
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[t] = tile[31 - t];
    """, header="int fibonacci(int n) { return n < 2 ? n : fibonacci(n - 1) + "
                "fibonacci(n - 2); }\n")
    x = np.arange(32, dtype=np.float32)
    out = call(kernel, x, 32, threads=32)
    assert kernel.last_engine.name == "fibers"
    assert kernel.last_engine.reason.startswith("the fast engine cannot run this kernel: "
                                                "clang did not inline")
    np.testing.assert_array_equal(out, np.where(np.arange(32) % 2, x * 2, x)[::-1])


def test_the_sanitizer_and_the_profiler_run_on_fibers(engine, monkeypatch) -> None:
    engine("fast")
    monkeypatch.setenv("MTWORK_PROFILER", "exact")
    # a text of its own: no counters kept from an earlier run stand in for the count
    kernel = mtwork.metal_kernel("engine_sanitized", ["inp"], ["out"],
                                 f"// {uuid.uuid4()}\n{TREE_SUM}")
    call(kernel, np.ones(256, np.float32), 1, sanitize="report")
    assert kernel.last_engine.name == "fibers"
    assert "sanitizer" in kernel.last_engine.reason
    out = call(kernel, np.ones(256, np.float32), 1, profile=True)
    assert kernel.last_engine.name == "fibers"
    assert kernel.last_engine.reason == "the profiler counts kernels on the fiber engine"
    assert out[0] == 256
    # counted again: the counters are kept, and the outputs come from a plain call
    again = call(kernel, np.ones(256, np.float32), 1, profile=True)
    assert kernel.last_engine.name == "fast" and again[0] == 256


def test_auto_builds_the_fast_library_beside_the_calls_once_fibers_took_long_enough(
        engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small dispatches (tests') never pay for the fast engine's build; once a kernel's
    calls have taken BUILD_AFTER_SECONDS on fibers its library is built in a thread while
    the calls go on on fibers, and the first call after the build runs fast."""
    engine("auto")
    x = RNG.standard_normal(4 * 256).astype(np.float32)
    # a text of its own: no fast library built by an earlier run is in the cache
    kernel = mtwork.metal_kernel("engine_lazy", ["inp"], ["out"],
                                 f"// {uuid.uuid4()}\n{TREE_SUM.replace('partial', 'lazy')}")
    reference = call(kernel, x, 4)
    assert kernel.last_engine.name == "fibers"
    assert f"once its calls have taken {sim_engine.BUILD_AFTER_SECONDS:g} s on fibers" in (
        kernel.last_engine.reason)
    monkeypatch.setattr(sim_engine, "BUILD_AFTER_SECONDS", 0.0)
    engines = backend("sim")._engines
    gate = threading.Event()  # holds the build until this call has seen it under way
    monkeypatch.setattr(sim_engine, "build", lambda program: gate.wait() and build(program))
    beside = call(kernel, x, 4)
    assert kernel.last_engine.name == "fibers"
    assert "is being built; its calls run on fibers" in kernel.last_engine.reason
    gate.set()
    engines.wait_for_builds()
    fast = call(kernel, x, 4)
    assert kernel.last_engine.name == "fast"
    assert fast.tobytes() == reference.tobytes() == beside.tobytes()


def test_auto_runs_a_kernel_whose_fast_library_is_cached_fast_from_its_first_call(
        engine) -> None:
    """A fast library built once (here by `fast`, in a new process by any earlier run)
    serves the kernel's first call under `auto`, with no fiber time spent first."""
    x = RNG.standard_normal(4 * 256).astype(np.float32)
    text = f"// {uuid.uuid4()}\n{TREE_SUM.replace('partial', 'cached')}"
    engine("fast")
    built = call(mtwork.metal_kernel("engine_cached", ["inp"], ["out"], text), x, 4)
    engine("auto")
    backend("sim")._engines = sim_engine.Engines()  # as a new process: nothing in memory
    kernel = mtwork.metal_kernel("engine_cached", ["inp"], ["out"], text)
    first = call(kernel, x, 4)
    assert kernel.last_engine.name == "fast"
    assert first.tobytes() == built.tobytes()


def test_a_kernel_that_never_blocks_runs_as_plain_loops(engine) -> None:
    engine("fast")
    kernel = mtwork.metal_kernel("engine_twice", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x; out[i] = 2.0f * inp[i];")
    out = call(kernel, np.arange(64, dtype=np.float32), 64, threads=32)
    assert kernel.last_engine.name == "loops"
    np.testing.assert_array_equal(out, 2 * np.arange(64))


def test_an_unknown_engine_is_refused_by_name(engine) -> None:
    engine("turbo")
    kernel = mtwork.metal_kernel("engine_refused_mode", ["inp"], ["out"], TREE_SUM)
    with pytest.raises(ValueError, match=r"MTWORK_SIM_ENGINE must be one of auto, fast, "
                                         r"fibers, compare, got 'turbo'"):
        call(kernel, np.ones(256, np.float32), 1)


class _BusyClock:
    """The clocks of `time`, but each reading of processor time 1.5 s later than the
    last: a call that took 1.5 s of processor time, however long it took on the wall."""

    def __init__(self) -> None:
        self.now = 0.0

    def process_time(self) -> float:
        self.now += 1.5
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_fiber_time_toward_the_build_is_processor_time_over_the_workers(
        engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine stretches a call's wall time, not its processor time: what counts
    toward building a kernel's fast library is the call's processor time over the
    runtime's workers (one per core), so a busy machine builds no more than a quiet one."""
    engine("auto")
    x = RNG.standard_normal(4 * 256).astype(np.float32)
    kernel = mtwork.metal_kernel("engine_busy", ["inp"], ["out"],
                                 f"// {uuid.uuid4()}\n{TREE_SUM.replace('partial', 'busy')}")
    engines = backend("sim")._engines
    before = dict(engines._fiber_seconds)
    monkeypatch.setattr(importlib.import_module("mtwork.backends.sim"), "time", _BusyClock())
    call(kernel, x, 4)
    assert kernel.last_engine.name == "fibers"
    added = {path: t for path, t in engines._fiber_seconds.items() if path not in before}
    assert list(added.values()) == [pytest.approx(1.5 / (os.cpu_count() or 1))]
