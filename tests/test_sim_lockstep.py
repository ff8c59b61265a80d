"""SIMD-group lockstep through threadgroup memory: on Apple GPUs the lanes of a SIMD-group
execute each instruction together, so a lane's threadgroup store is seen by the other
lanes' next load and every lane's load comes before a later store, with no
simdgroup_barrier between. llama.cpp's vector flash attention relies on both (see
tests/conformance/test_llama_cpp_flash_attn.py); these kernels have its two shapes, plus
divergence, early returns and barriers around the steps. The MSL specification leaves such
code undefined, so the sanitizer still reports it as a race."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.compile.lockstep import needs_lockstep
from mtwork.sanitizer import SanitizerError

# Every lane reads its neighbour's slot, then lane 0 overwrites lane 4's (fa_vec's `ss`:
# read by all lanes, then rewritten by lane 0, with no simdgroup_barrier between).
READ_THEN_OVERWRITE = """
    threadgroup float s[64];
    uint l = thread_index_in_simdgroup, base = simdgroup_index_in_threadgroup * 32;
    s[base + l] = inp[thread_position_in_grid.x];
    simdgroup_barrier(mem_flags::mem_threadgroup);
    float mine = s[base + (l + 1) % 32];
    if (l == 0) s[base + 5] = -100.0f;
    out[thread_position_in_grid.x] = mine;
"""

# The last lane stores, every lane loads what it stored.
STORE_THEN_READ = """
    threadgroup float s[2];
    uint l = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
    if (l == 31) s[sg] = inp[thread_position_in_grid.x];
    out[thread_position_in_grid.x] = s[sg];
"""

# Lanes past 20 return; the others take two branches that store into their own halves,
# meet at a barrier, and read a lane of the other half.
DIVERGED = """
    threadgroup float s[64];
    uint l = thread_index_in_simdgroup, base = simdgroup_index_in_threadgroup * 32;
    if (l >= 20) return;
    if (l < 10) s[base + l] = inp[thread_position_in_grid.x];
    else s[base + l] = 2.0f * inp[thread_position_in_grid.x];
    float v = s[base + (l + 10) % 20];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[thread_position_in_grid.x] = v + s[base];
"""


def _kernel(name: str, source: str) -> mtwork.MetalKernel:
    return mtwork.metal_kernel(name, ["inp"], ["out"], source)


def _run(kernel: mtwork.MetalKernel, n: int = 64, **extra) -> np.ndarray:
    x = mx.array(np.arange(1, n + 1, dtype=np.float32))
    out = kernel(inputs=[x], grid=(n, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(n,)],
                 output_dtypes=[mx.float32], init_value=-1, **extra)
    return np.array(out[0])


def test_every_lane_loads_before_a_later_store_of_another_lane() -> None:
    out = _run(_kernel("read_then_overwrite", READ_THEN_OVERWRITE), 128).reshape(-1, 32)
    x = np.arange(1, 129, dtype=np.float32).reshape(-1, 32)
    np.testing.assert_array_equal(out, np.roll(x, -1, axis=1))


def test_a_store_is_seen_by_the_other_lanes_next_load() -> None:
    out = _run(_kernel("store_then_read", STORE_THEN_READ)).reshape(-1, 32)
    expected = np.repeat(np.arange(1, 65, dtype=np.float32).reshape(-1, 32)[:, -1:], 32, 1)
    np.testing.assert_array_equal(out, expected)


def test_diverged_and_returned_lanes_step_without_deadlock() -> None:
    out = _run(_kernel("diverged_steps", DIVERGED)).reshape(-1, 32)
    x = np.arange(1, 65, dtype=np.float32).reshape(-1, 32)
    stored = np.where(np.arange(32) < 10, x, 2 * x)[:, :20]
    expected = np.full((2, 32), -1.0, np.float32)
    expected[:, :20] = stored[:, (np.arange(20) + 10) % 20] + stored[:, :1]
    np.testing.assert_array_equal(out, expected)


def test_the_sanitizer_still_reports_the_race_and_the_result_is_right() -> None:
    kernel = _kernel("read_then_overwrite_sanitized", READ_THEN_OVERWRITE)
    try:
        out = _run(kernel, sanitize=True)
        report = kernel.last_sanitizer_report
    except SanitizerError as error:
        report, out = error.report, None
    assert [f.kind for f in report.findings] == ["threadgroup memory race"]
    if out is not None:
        x = np.arange(1, 65, dtype=np.float32).reshape(-1, 32)
        np.testing.assert_array_equal(out.reshape(-1, 32), np.roll(x, -1, axis=1))


def test_a_lockstep_kernel_stays_off_the_fast_engine_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTWORK_SIM_ENGINE", "fast")
    kernel = _kernel("read_then_overwrite_engine", READ_THEN_OVERWRITE)
    _run(kernel, isolate=False)
    assert kernel.last_engine.name == "fibers"
    assert "lockstep" in kernel.last_engine.reason


@pytest.mark.parametrize(("body", "expected"), [
    (READ_THEN_OVERWRITE, True),
    (STORE_THEN_READ, True),
    # a barrier or a SIMD-group function between the store and the load
    ("threadgroup float s[32]; s[l] = 1; threadgroup_barrier(mem_flags::mem_threadgroup);"
     " out[l] = s[31 - l];", False),
    ("threadgroup float s[32]; s[l] = 1; out[l] = simd_sum(s[31 - l]);", True),
    ("threadgroup float s[32]; float v = s[l]; v = simd_sum(v); s[l] = v;", False),
    # a lane's own element, read and written in one statement
    ("threadgroup float s[32]; s[l] = 0; simdgroup_barrier(mem_flags::mem_none);"
     " s[l] += 1.0f;", False),
    # different arrays
    ("threadgroup float a[32], b[32]; a[l] = 1; out[l] = b[l];", False),
    # an element read, then written back in the next statement (a read-modify-write)...
    ("threadgroup float g[32]; if (l == 0) { for (int t = 0; t < 32; ++t) {"
     " float p = g[t] * 2; g[t] = p; } }", False),
    # ...but the same element stored, then read (by any lane)
    ("threadgroup float g[2]; if (l == 0) g[1] = 2; out[l] = g[1];", True),
    # the way round a loop: the load at the top sees the store at the bottom
    ("threadgroup float s[32]; for (int i = 0; i < 4; ++i) { float v = s[l];"
     " v = simd_sum(v); s[(l + 1) % 32] = v; }", True),
    # a thread's array of pointers into threadgroup memory is not itself shared
    ("threadgroup float * p[2]; p[0] = shmem; p[1] = shmem + 32;"
     " threadgroup_barrier(mem_flags::mem_threadgroup); out[l] = p[1][l];", False),
])
def test_the_text_check_finds_a_store_and_a_load_with_nothing_between(body, expected) -> None:
    source = ("kernel void k(device float* out [[buffer(0)]], threadgroup float* shmem "
              "[[threadgroup(0)]], uint l [[thread_index_in_simdgroup]]) {" + body + "}")
    assert needs_lockstep([source]) is expected
