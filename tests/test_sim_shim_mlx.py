"""MLX kernel families that needed a piece of the Metal standard library the emulator now
has, read from the headers in the installed `mlx` wheel and run as MLX's host code runs
them (the comments name the MLX source), against independent references:

- unary.h with fp8.h and copy.h (bfloat <-> half casts),
- binary_two.h DivMod and scan.h (metal::array),
- gemv.h (metal::uniform),
- fp_quantized.h with fp4.h (bfloat casts, mixed bfloat/float arithmetic).
"""

from __future__ import annotations

from pathlib import Path

import mlx
import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import new_buffer

TYPE = {mx.float32: "float", mx.float16: "half", mx.bfloat16: "bfloat16_t"}


def mlx_header(relative: str, before: tuple[str, ...] = ()) -> mtwork.Library:
    """An MLX kernel header loaded as its `.metal` file compiles it: utils.h, the headers
    in `before`, then the header."""
    root = Path(mlx.__path__[0]) / "include"
    if not (root / "mlx/backend/metal/kernels/utils.h").is_file():
        pytest.skip("the installed mlx package ships no Metal kernel headers")
    prelude = "".join(f'#include "mlx/backend/metal/kernels/{h}"\n'
                      for h in ("utils.h", *before))
    return mtwork.load_metal(root / "mlx/backend/metal/kernels" / relative, prelude=prelude)


def as_f64(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32), dtype=np.float64)


def elementwise_dispatch(size: int, work_per_thread: int) -> dict:
    # MLX's unary.cpp / copy.cpp / binary.cpp, contiguous case: ceil(size / N) threads,
    # threadgroups of up to 1024 of them, dispatched by threads.
    threads = -(-size // work_per_thread)
    return {"grid": (threads,), "threads_per_threadgroup": (min(threads, 1024),)}


def test_unary_fp8_to_and_from_bfloat() -> None:
    lib = mlx_header("unary.h", before=("unary_ops.h",))
    codes = np.arange(256, dtype=np.uint8)
    # WorkPerThread<uint8_t> is 8 elements, WorkPerThread<bfloat16_t> 4 (utils.h).
    decode = lib.kernel("unary_v", template=("uint8_t", "bfloat16_t", "FromFP8"))
    out = decode(buffers={"in": codes, "out": new_buffer(256, mx.bfloat16), "size": 256},
                 **elementwise_dispatch(256, 8))
    want = mx.from_fp8(mx.array(codes), dtype=mx.bfloat16)
    nan = np.isnan(as_f64(want))
    np.testing.assert_array_equal(as_f64(out.mx("out"))[~nan], as_f64(want)[~nan])
    assert np.isnan(as_f64(out.mx("out"))[nan]).all()

    x = mx.array(np.random.default_rng(0).standard_normal(999) * 60).astype(mx.bfloat16)
    encode = lib.kernel("unary_v", template=("bfloat16_t", "uint8_t", "ToFP8"))
    out = encode(buffers={"in": x, "out": new_buffer(999, mx.uint8), "size": 999},
                 **elementwise_dispatch(999, 4))
    np.testing.assert_array_equal(out["out"], np.array(mx.to_fp8(x)))


def test_copy_half_to_bfloat_rounds_like_astype() -> None:
    lib = mlx_header("copy.h")
    h = mx.array(np.random.default_rng(1).standard_normal(1000) * 300).astype(mx.float16)
    kernel = lib.kernel("copy_v", template=("half", "bfloat16_t"))  # 4 per thread
    out = kernel(buffers={"src": h, "dst": new_buffer(1000, mx.bfloat16), "size": 1000},
                 **elementwise_dispatch(1000, 4))
    np.testing.assert_array_equal(np.array(out.mx("dst").view(mx.uint16)),
                                  np.array(h.astype(mx.bfloat16).view(mx.uint16)))


@pytest.mark.parametrize("dtype", [mx.int32, mx.bfloat16])
def test_binary_two_divmod_returns_a_metal_array(dtype: mx.Dtype) -> None:
    rng = np.random.default_rng(2)
    n = 999
    sign = rng.choice([-1, 1], n)
    if dtype == mx.int32:
        a = mx.array(rng.integers(-60, 60, n).astype(np.int32))
        b = mx.array((rng.integers(1, 9, n) * sign).astype(np.int32))
        name, per_thread = "int32_t", 2
    else:
        a = mx.array(rng.standard_normal(n) * 10).astype(dtype)
        b = mx.array(rng.uniform(0.5, 3, n) * sign).astype(dtype)
        name, per_thread = "bfloat16_t", 4
    kernel = mlx_header("binary_two.h", before=("binary_ops.h",)).kernel(
        "binary_vv", template=(name, name, "DivMod"))
    out = kernel(buffers={"a": a, "b": b, "c": new_buffer(n, dtype), "d": new_buffer(n, dtype),
                          "size": n}, **elementwise_dispatch(n, per_thread))
    quotient, remainder = mx.divmod(a, b)
    np.testing.assert_array_equal(as_f64(out.mx("c")), as_f64(quotient))
    np.testing.assert_array_equal(as_f64(out.mx("d")), as_f64(remainder))


def test_contiguous_scan_sums_rows() -> None:
    rows, size, n_reads = 3, 777, 4
    x = mx.array(np.random.default_rng(3).standard_normal((rows, size)).astype(np.float32))
    kernel = mlx_header("scan.h").kernel(
        "contiguous_scan", template=("float", "float", "CumSum<float>", n_reads, True, False))
    # MLX's scan.cpp: rows up to 4096 elements take ceil(size / (4 * 32)) SIMD-groups.
    threads = -(-size // (n_reads * 32)) * 32
    out = kernel(buffers={"in": x, "out": new_buffer((rows, size)), "axis_size": size},
                 grid=(threads, rows, 1), threads_per_threadgroup=(threads, 1, 1))
    np.testing.assert_allclose(out["out"], np.cumsum(as_f64(x), axis=1), rtol=1e-5, atol=1e-5)


GEMV_BATCH = {"batch_ndim": 1, "batch_shape": np.array([1], np.int32),
              "vector_batch_stride": np.zeros(1, np.int64),
              "matrix_batch_stride": np.zeros(1, np.int64),
              "bias_batch_stride": np.zeros(1, np.int64), "bias_stride": 0,
              "alpha": 1.0, "beta": 0.0}


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_gemv_uniform_loops_over_a_leftover_block(dtype: mx.Dtype) -> None:
    # MLX's matmul.cpp gemv_axbpy, matrix not transposed: bm = 4, bn = 1, sm = 1, sn = 32,
    # tm = tn = 4, threadgroups of (32, bn, bm) covering bm * sm * tm rows each.
    rng = np.random.default_rng(4)
    m, k = 45, 300  # 300 leaves a partial block of the uniform loop
    mat = mx.array(rng.standard_normal((m, k))).astype(dtype)
    vec = mx.array(rng.standard_normal(k)).astype(dtype)
    kernel = mlx_header("gemv.h").kernel(
        "gemv", template=(TYPE[dtype], 4, 1, 1, 32, 4, 4, False, False))
    out = kernel(buffers={"mat": mat, "in_vec": vec, "bias": vec, "out_vec": new_buffer(m, dtype),
                          "in_vec_size": k, "out_vec_size": m, "marix_ld": k, **GEMV_BATCH},
                 threadgroups=(-(-m // 16), 1, 1), threads_per_threadgroup=(32, 1, 4))
    assert mtwork.diff(out.mx("out_vec"), as_f64(mat) @ as_f64(vec)).ok


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_gemv_transposed(dtype: mx.Dtype) -> None:
    # gemv_axbpy, matrix transposed, fewer than 512 outputs: bm = 1, bn = 2, sm = 8, sn = 4,
    # tm = tn = 4; each threadgroup covers bn * sn * tn = 32 outputs.
    rng = np.random.default_rng(5)
    k, n = 300, 96
    mat = mx.array(rng.standard_normal((k, n))).astype(dtype)
    vec = mx.array(rng.standard_normal(k)).astype(dtype)
    kernel = mlx_header("gemv.h").kernel(
        "gemv_t", template=(TYPE[dtype], 1, 2, 8, 4, 4, 4, False, False))
    out = kernel(buffers={"mat": mat, "in_vec": vec, "bias": vec, "out_vec": new_buffer(n, dtype),
                          "in_vec_size": k, "out_vec_size": n, "marix_ld": n, **GEMV_BATCH},
                 threadgroups=(n // 32, 1, 1), threads_per_threadgroup=(32, 2, 1))
    assert mtwork.diff(out.mx("out_vec"), as_f64(vec) @ as_f64(mat)).ok


def test_fp_quantized_mxfp4_matrix_vector_in_bfloat() -> None:
    # MLX's quantized.cpp qmv: the fast kernel (N % 8 == 0, K % 512 == 0), threadgroups of
    # (32, 2) over (M, N / 8, batch); unbatched, so the shape and stride buffers are unused.
    lib = mlx_header("fp_quantized.h", before=("steel/gemm/gemm.h", "quantized_utils.h"))
    k, n = 512, 64
    w = mx.random.normal((n, k), key=mx.random.key(0)).astype(mx.bfloat16)
    wq, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")
    x = mx.random.normal((1, k), key=mx.random.key(1)).astype(mx.bfloat16)
    unused_int, unused_long = np.zeros(1, np.int32), np.zeros(1, np.int64)
    kernel = lib.kernel("fp_qmv_fast", template=("bfloat16_t", 32, 4, False))
    out = kernel(buffers={"w": wq, "scales": scales, "global_scale": np.zeros(1, np.float32),
                          "x": x, "y": new_buffer((1, n), mx.bfloat16), "in_vec_size": k,
                          "out_vec_size": n, "x_batch_ndims": 0, "x_shape": unused_int,
                          "x_strides": unused_long, "w_batch_ndims": 0, "w_shape": unused_int,
                          "w_strides": unused_long, "s_strides": unused_long},
                 threadgroups=(1, n // 8, 1), threads_per_threadgroup=(32, 2, 1))
    weights = as_f64(mx.dequantize(wq, scales, group_size=32, bits=4, mode="mxfp4"))
    report = mtwork.diff(out.mx("y"), as_f64(x) @ weights.T)
    assert report.ok and report.max_ulp <= 1


@pytest.mark.parametrize("arg_sort", [True, False])
def test_block_sort_of_bfloat_rows(arg_sort: bool) -> None:
    # sort.h stores a bfloat into the output in the branch it does not take for argsort
    # (a uint output), as MSL's implicit conversions allow. MLX's sort.cpp, one block per
    # row: tn = 4, bn = 64 for rows of 129 to 256 elements, threadgroups (1, rows).
    rows, size, bn, tn = 3, 200, 64, 4
    rng = np.random.default_rng(6)
    values = np.stack([rng.permutation(np.arange(-100, 100)) for _ in range(rows)])
    x = mx.array(values.astype(np.float32)).astype(mx.bfloat16)  # integers: exact
    out_type, out_dtype = ("uint32_t", mx.uint32) if arg_sort else ("bfloat16_t", mx.bfloat16)
    kernel = mlx_header("sort.h").kernel(
        "block_sort", template=("bfloat16_t", out_type, arg_sort, bn, tn))
    out = kernel(buffers={"inp": x, "out": new_buffer((rows, size), out_dtype),
                          "size_sorted_axis": size, "in_stride_sorted_axis": 1,
                          "out_stride_sorted_axis": 1, "in_stride_segment_axis": size,
                          "out_stride_segment_axis": size},
                 threadgroups=(1, rows, 1), threads_per_threadgroup=(bn, 1, 1))
    got = out["out"] if arg_sort else as_f64(out.mx("out"))
    want = np.argsort(values, axis=1) if arg_sort else np.sort(values, axis=1)
    np.testing.assert_array_equal(got, want)
