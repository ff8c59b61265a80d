"""Execution semantics as Apple GPUs have them: a threadgroup barrier counts SIMD-groups,
threads that returned never hold it back, and a barrier inside a branch only some lanes
of each SIMD-group take completes. MLX's own gemv and gemv_t (from the installed wheel)
rely on this; so do fft.h's early returns, shown here by small kernels of the same shape.
Code the MSL specification leaves undefined still gets a sanitizer finding, and SIMD-groups
waiting at different barriers are still a deadlock."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np
import pytest
from conformance.sources import mlx_header

import mtwork
from mtwork import new_buffer
from mtwork.sanitizer import SanitizerError, SanitizerReport


def sanitized(kernel: mtwork.MetalKernel, n: int, tg: int) -> SanitizerReport:
    try:
        kernel(inputs=[mx.zeros((n,))], grid=(n, 1, 1), threadgroup=(tg, 1, 1),
               output_shapes=[(n,)], output_dtypes=[mx.float32], init_value=0, sanitize=True)
    except SanitizerError as error:
        return error.report
    return kernel.last_sanitizer_report


def run(kernel: mtwork.MetalKernel, n: int, tg: int, **extra) -> np.ndarray:
    x = mx.array(np.arange(n, dtype=np.float32))
    out = kernel(inputs=[x], grid=(n, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[(n,)],
                 output_dtypes=[mx.float32], init_value=-1, **extra)
    return np.array(out[0])


# --- threads that returned ------------------------------------------------------------


EARLY_RETURN = mtwork.metal_kernel("early_return", ["inp"], ["out"], """
    // fft.h's shape: threads past the data return, the rest share threadgroup memory.
    threadgroup float buf[256];
    uint t = thread_position_in_threadgroup.x;
    uint live = 200;
    if (t >= live) return;
    buf[t] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[thread_position_in_grid.x] = buf[live - 1 - t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
""")


def test_threads_that_returned_do_not_hold_a_barrier_back() -> None:
    out = run(EARLY_RETURN, 512, 256).reshape(2, 256)
    base = np.arange(2)[:, None] * 256
    expected = np.where(np.arange(256) < 200, base + 199 - np.arange(256), -1)
    np.testing.assert_array_equal(out, expected)


def test_the_sanitizer_reports_a_barrier_some_threads_returned_before() -> None:
    report = sanitized(EARLY_RETURN, 512, 256)
    found = report.of_kind("barrier divergence")
    assert found and found[0].line == "source:8", str(report)
    assert found[0].other_thread[0] >= 200  # a thread that returned


def test_last_thread_returning_releases_the_barrier() -> None:
    # The thread that returns runs after all the others already wait.
    kernel = mtwork.metal_kernel("last_returns", ["inp"], ["out"], """
        threadgroup float buf[64];
        uint t = thread_position_in_threadgroup.x;
        if (t == 63) return;
        buf[t] = inp[t] * 2;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[t] = buf[62 - t];
    """)
    out = run(kernel, 64, 64)
    np.testing.assert_array_equal(out[:63], 2 * (62 - np.arange(63)))
    assert out[63] == -1


# --- a barrier in a branch some lanes skip ----------------------------------------------


LANE_ZERO_REDUCE = mtwork.metal_kernel("lane_zero_reduce", ["inp"], ["out"], """
    // gemv.h's shape: lane 0 of each SIMD-group publishes its SIMD-group's sum and waits
    // at a barrier inside the branch; the other lanes skip it and return.
    threadgroup float part[8];
    uint sg = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
    float v = simd_sum(inp[thread_position_in_grid.x]);
    if (lane == 0) {
        part[sg] = v;
        threadgroup_barrier(mem_flags::mem_none);
        if (sg == 0) {
            float total = 0;
            for (uint i = 0; i < simdgroups_per_threadgroup; ++i) total += part[i];
            out[threadgroup_position_in_grid.x] = total;
        }
    }
""")


def test_barrier_in_a_branch_some_lanes_skip() -> None:
    out = run(LANE_ZERO_REDUCE, 1024, 256)
    sums = np.arange(1024, dtype=np.float64).reshape(4, 256).sum(axis=1)
    np.testing.assert_array_equal(out[:4], sums)


def test_the_sanitizer_reports_a_barrier_some_lanes_skip() -> None:
    report = sanitized(LANE_ZERO_REDUCE, 256, 256)
    found = report.of_kind("barrier divergence")
    assert found and found[0].line == "source:9", str(report)


def test_barrier_in_a_loop_only_some_lanes_run() -> None:
    # gemv_t's shape: lanes past the output skip a loop with a barrier in every
    # iteration, and meet the others at a SIMD-group function after it.
    kernel = mtwork.metal_kernel("loop_some_lanes", ["inp"], ["out"], """
        threadgroup float row[64];
        uint t = thread_position_in_threadgroup.x;
        float acc = 0;
        if (t % 32 < 20) {
            for (uint i = 0; i < 4; ++i) {
                threadgroup_barrier(mem_flags::mem_threadgroup);
                row[t] = inp[i * 64 + t];
                threadgroup_barrier(mem_flags::mem_threadgroup);
                acc += row[t ^ 1u];
            }
        }
        out[thread_position_in_grid.x] = simd_sum(acc);
    """)
    x = np.arange(256, dtype=np.float32)
    out = np.array(kernel(inputs=[mx.array(x)], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                          output_shapes=[(64,)], output_dtypes=[mx.float32])[0])
    t = np.arange(64)
    acc = np.where(t % 32 < 20, x.reshape(4, 64)[:, t ^ 1].sum(axis=0), 0)
    expected = np.repeat(acc.reshape(2, 32).sum(axis=1), 32)
    np.testing.assert_array_equal(out, expected)


def test_collective_before_a_barrier_goes_first() -> None:
    # Half the lanes take a SIMD-group function in a branch, then every lane meets at the
    # barrier after it: the function completes for the lanes in the branch first.
    kernel = mtwork.metal_kernel("simd_then_barrier", ["inp"], ["out"], """
        threadgroup float buf[64];
        uint t = thread_position_in_threadgroup.x;
        float v = inp[t];
        if (thread_index_in_simdgroup < 16) v = simd_sum(v);
        buf[t] = v;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[t] = buf[63 - t];
    """)
    x = np.arange(64, dtype=np.float32)
    out = run(kernel, 64, 64)
    v = x.copy()
    for sg in range(2):
        lanes = slice(32 * sg, 32 * sg + 16)
        v[lanes] = x[lanes].sum()
    np.testing.assert_array_equal(out, v[::-1])


# --- true deadlocks ---------------------------------------------------------------------


def test_simdgroups_at_different_barriers_deadlock_and_are_reported() -> None:
    body = """
        if (simdgroup_index_in_threadgroup == 1) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        } else {
            threadgroup_barrier(mem_flags::mem_device);
        }
        out[thread_position_in_grid.x] = 1;
    """
    kernel = mtwork.metal_kernel("simdgroups_split", ["inp"], ["out"], body)
    with pytest.raises(mtwork.KernelDeadlock, match="different threadgroup_barrier calls.*"
                                                     "no SIMD-group has lanes at both"):
        run(kernel, 96, 96)
    assert sanitized(kernel, 96, 96).of_kind("barrier divergence")


def test_lanes_split_between_two_barriers_of_one_simdgroup_run() -> None:
    # Within one SIMD-group the hardware runs one side of the branch, then the other:
    # each barrier completes with the lanes that reach it.
    kernel = mtwork.metal_kernel("lanes_split", ["inp"], ["out"], """
        uint t = thread_position_in_threadgroup.x;
        if (t < 16) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
        } else {
            threadgroup_barrier(mem_flags::mem_device);
        }
        out[t] = float(t);
    """)
    np.testing.assert_array_equal(run(kernel, 32, 32), np.arange(32))


# --- MLX's gemv and gemv_t, dispatched as mlx/backend/metal/matmul.cpp does ---------------


class Gemv(NamedTuple):
    """gemv_axbpy's choice of kernel and tile sizes (matmul.cpp) for an output of length
    `out` from inputs of length `k`."""

    name: str
    bm: int
    bn: int
    sm: int
    sn: int
    tm: int
    tn: int

    @property
    def outputs_per_threadgroup(self) -> int:
        if self.name == "gemv":
            return self.bm * self.sm * self.tm
        return self.bn * self.sn * self.tn


def gemv_choice(transposed: bool, out: int, k: int) -> Gemv:
    if transposed:
        sm, sn = (4, 8) if k >= 8192 and out >= 2048 else (8, 4)
        bn = 16 if out >= 2048 else 4 if out >= 512 else 2
        return Gemv("gemv_t", 1, bn, sm, sn, 4, 1 if out < 4 else 4)
    bm, bn, sm, sn = (8 if out >= 4096 else 4), 1, 1, 32
    if k <= 64:
        bm, sm, sn = 1, 8, 4
    elif k >= 16 * out:
        bm, bn = 1, 8
    return Gemv("gemv", bm, bn, sm, sn, 1 if out < 4 else 4, 4)


def mlx_gemv(choice: Gemv, mat: mx.array, vec: mx.array, out_len: int) -> mx.array:
    kernel = mlx_header("gemv.h").kernel(
        choice.name, template=(mx.float32, *choice[1:], False, False))
    zero = np.zeros(1, np.int64)
    groups = -(-out_len // choice.outputs_per_threadgroup)
    result = kernel(
        buffers={"mat": mat, "in_vec": vec, "bias": vec, "out_vec": new_buffer((out_len,)),
                 "in_vec_size": vec.size, "out_vec_size": out_len, "marix_ld": mat.shape[1],
                 "alpha": 1.0, "beta": 0.0, "batch_ndim": 1,
                 "batch_shape": np.ones(1, np.int32), "vector_batch_stride": zero,
                 "matrix_batch_stride": zero, "bias_batch_stride": zero, "bias_stride": 1},
        threadgroups=(groups, 1, 1), threads_per_threadgroup=(32, choice.bn, choice.bm))
    return result.mx("out_vec")


# Shapes that take each of matmul.cpp's branches: rows of the output that leave SIMD-groups
# or lanes idle, a threadgroup reduction (bn = 8), short and long inputs.
@pytest.mark.parametrize("m, k", [(100, 300), (33, 50), (20, 4096), (7, 1000), (4100, 40)])
def test_mlx_gemv_matches_matmul(m: int, k: int) -> None:
    rng = np.random.default_rng(m * k)
    a = mx.array(rng.standard_normal((m, k)).astype(np.float32))
    x = mx.array(rng.standard_normal(k).astype(np.float32))
    got = mlx_gemv(gemv_choice(False, m, k), a, x, m)
    expected = mx.matmul(a, x, stream=mx.cpu)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4 * k**0.5)


@pytest.mark.parametrize("n, k", [(100, 300), (7, 129), (600, 70), (2050, 33), (3, 64)])
def test_mlx_gemv_t_matches_matmul(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    b = mx.array(rng.standard_normal((k, n)).astype(np.float32))
    x = mx.array(rng.standard_normal(k).astype(np.float32))
    got = mlx_gemv(gemv_choice(True, n, k), b, x, n)
    expected = mx.matmul(x, b, stream=mx.cpu)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4 * k**0.5)
