"""MLX's matrix-vector products (gemv.h: gemv, gemv_t, gemv_wide; dot.h) on `sim`,
against `@` and `mx.addmm` on the CPU.

Template arguments are instantiations of MLX's gemv.metal (`instantiate_gemv_blocks`,
`instantiate_gemv_t_blocks`, `instantiate_gemv_wide`); the blocking (bm, bn, sm, sn, tm,
tn), the buffers and the grid follow matmul.cpp's `gemv_axbpy` and `gemv_wide` for the
shapes chosen. MLX leaves the bias arguments of a product without bias unbound (the kernel
does not read them); mtwork binds every buffer a kernel declares, so the tests pass
placeholders there.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, ceil_div, metal_library, rng

NO_BIAS = {"bias": np.zeros(1, np.float32), "alpha": 1.0, "beta": 0.0,
           "bias_batch_stride": np.zeros(1, np.int64), "bias_stride": 0}


def _gemv_library():
    return metal_library("gemv.h")


def _matrix(shape: tuple[int, ...], dtype: mx.Dtype = mx.float32) -> mx.array:
    return mx.array(rng().standard_normal(shape) / np.sqrt(shape[-1]), dtype)


@pytest.mark.parametrize("axpby", [False, True])
def test_gemv(agreement, axpby) -> None:
    # out = mat @ vec with mat (M, K) row-major: gemv with bm = 4 SIMD-groups of 1 x 32
    # threads, tm = tn = 4, so 16 outputs a threadgroup (M = 300 leaves a partial one);
    # with a bias, out = alpha * (mat @ vec) + beta * bias (kDoAxpby).
    m, k = 300, 500
    mat, vec = _matrix((m, k)), _matrix((k,))
    built = build(_gemv_library(), "gemv", (mx.float32, 4, 1, 1, 32, 4, 4, False, axpby))
    buffers = {"mat": mat, "in_vec": vec, "out_vec": new_buffer((m,), mx.float32),
               "in_vec_size": k, "out_vec_size": m, "marix_ld": k, "batch_ndim": 1,
               "batch_shape": np.array([1], np.int32),
               "vector_batch_stride": np.array([k], np.int64),
               "matrix_batch_stride": np.array([m * k], np.int64), **NO_BIAS}
    expected = mat @ vec
    if axpby:
        bias = _matrix((m,))
        buffers |= {"bias": bias, "alpha": 2.0, "beta": 0.5,
                    "bias_batch_stride": np.array([m], np.int64), "bias_stride": 1}
        expected = mx.addmm(bias[None], vec[None], mat.T, alpha=2.0, beta=0.5)[0]
    out = run_both(built.kernel, buffers=buffers, threadgroups=(-(-m // 16), 1, 1),
                   threads_per_threadgroup=(32, 1, 4))
    label = "gemv<float32, 4, 1, 1, 32, 4, 4>" + (" axpby" if axpby else "")
    agreement(label, MLX, out.mx("out_vec"), expected, reference="matmul (CPU)",
              compile_s=built.compile_s, atol=1e-5, rtol=1e-4)


def test_gemv_t(agreement) -> None:
    # out = vec @ mat with mat (K, N): gemv_t (the matrix read transposed), SIMD-groups
    # of 8 x 4 threads, bn = 2 of them (N < 512), tn = 4: 32 outputs a threadgroup.
    k, n = 700, 300
    vec, mat = _matrix((k,)), _matrix((k, n))
    built = build(_gemv_library(), "gemv_t", (mx.float32, 1, 2, 8, 4, 4, 4, False, False))
    out = run_both(built.kernel,
                   buffers={"mat": mat, "in_vec": vec, "out_vec": new_buffer((n,), mx.float32),
                            "in_vec_size": k, "out_vec_size": n, "marix_ld": n,
                            "batch_ndim": 1, "batch_shape": np.array([1], np.int32),
                            "vector_batch_stride": np.array([k], np.int64),
                            "matrix_batch_stride": np.array([k * n], np.int64), **NO_BIAS},
                   threadgroups=(-(-n // 32), 1, 1), threads_per_threadgroup=(32, 2, 1))
    agreement("gemv_t<float32, 1, 2, 8, 4, 4, 4>", MLX, out.mx("out_vec"), vec @ mat,
              reference="matmul (CPU)", compile_s=built.compile_s, atol=1e-5, rtol=1e-4)


def test_gemv_wide(agreement) -> None:
    # x (M, K) @ w.T for M = 4 half-precision vectors: gemv_wide_config gives one pass
    # of vecs_per_tg = 4 with full SIMD rows (k_lanes = 32), threadgroups (32, 4, 1),
    # grid (1, ceil(N / 4), batch); the function constants gemv_wide_has_batch and
    # gemv_wide_do_axpby live in gemv.h itself.
    m, n, k = 4, 90, 256
    x, w = _matrix((m, k), mx.float16), _matrix((n, k), mx.float16)
    built = build(_gemv_library(), "gemv_wide", (mx.float16, 4, 32),
                  constants={"gemv_wide_has_batch": False, "gemv_wide_do_axpby": False})
    out = run_both(built.kernel,
                   buffers={"mat": w, "in_vec": x, "out_vec": new_buffer((m, n), mx.float16),
                            "in_vec_size": k, "out_vec_size": n, "M": m, "matrix_ld": k,
                            "vector_ld": k, "batch_ndim": 1,
                            "batch_shape": np.array([1], np.int32),
                            "vector_batch_stride": np.array([m * k], np.int64),
                            "matrix_batch_stride": np.array([n * k], np.int64)},
                   threadgroups=(1, -(-n // 4), 1), threads_per_threadgroup=(32, 4, 1))
    expected = (x.astype(mx.float32) @ w.astype(mx.float32).T).astype(mx.float16)
    agreement("gemv_wide<float16, 4, 32>", MLX, out.mx("out_vec"), expected,
              reference="matmul in float32 (CPU)", compile_s=built.compile_s,
              atol=2e-3, rtol=2e-3)


def test_dot_product(agreement) -> None:
    # matmul.cpp's dot_product for (1, K) @ (K, 1): dot_product<T, 32, 512, 16> writes
    # one partial sum per threadgroup of 512 threads (32 elements a thread), which
    # all_reduce (reduce.h) then sums, as all_reduce_dispatch does.
    k, items, group = 50_000, 32, 512
    a, b = _matrix((k,)), _matrix((k,))
    blocks = ceil_div(ceil_div(k, items), group)
    built = build(metal_library("dot.h"), "dot_product", (mx.float32, items, group, 16))
    partials = run_both(built.kernel,
                        buffers={"a": a, "b": b, "output": new_buffer((blocks,), mx.float32),
                                 "n": k},
                        grid=(blocks * group,), threads_per_threadgroup=(group,))["output"]
    reduce = build(metal_library("defines.h", "utils.h", "atomic.h", "reduction/ops.h",
                                 "reduce.h"), "all_reduce", ("float", "float", "Sum<float>"))
    total = run_both(reduce.kernel, buffers={"in": partials, "out": new_buffer((1,), mx.float32),
                                             "in_size": blocks, "row_size": blocks},
                     grid=(32,), threads_per_threadgroup=(32,))
    agreement("dot_product<float32, 32, 512, 16>", MLX, total.mx("out")[0], a @ b,
              reference="matmul (CPU)", compile_s=built.compile_s, atol=1e-5, rtol=1e-4)
