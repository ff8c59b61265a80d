"""MLX's quantized kernels (quantized.h: affine; fp_quantized.h: mxfp4, nvfp4, mxfp8) on
`sim`, against `mx.quantize`, `mx.dequantize` and `mx.quantized_matmul` on the CPU.

Template arguments are instantiations of MLX's quantized.metal and fp_quantized.metal
(`instantiate_quantized_batched(affine_qmv, float, 64, 4, 0)`, ...); the kernel chosen,
the buffers and the geometry follow quantized.cpp (`qmv`, `qvm`, `qmm`, `quantize_impl`).
Unbatched calls skip `add_strides_and_shapes`, leaving the batch buffers unbound; mtwork
binds every buffer, so the tests pass placeholders there. The products agree within
float32 rounding; quantize and dequantize are bitwise.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, ceil_div, metal_library, rng

# quantized.metal / fp_quantized.metal include the steel GEMM headers (for qmm) first.
AFFINE = ("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "quantized.h")
FP = ("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "fp_quantized.h")
FP_MODES = {"mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}

_NONE = np.zeros(1, np.int32)
UNBATCHED = {"x_batch_ndims": 0, "x_shape": _NONE, "x_strides": _NONE.astype(np.int64),
             "w_batch_ndims": 0, "w_shape": _NONE, "w_strides": _NONE.astype(np.int64),
             "s_strides": _NONE.astype(np.int64)}


def _weights(n: int, k: int, mode: str = "affine", group_size: int = 64, bits: int = 4):
    w = mx.array(rng().standard_normal((n, k)), mx.float32)
    return w, mx.quantize(w, group_size=group_size, bits=bits, mode=mode)


def _x(m: int, k: int) -> mx.array:
    return mx.array(np.random.default_rng(1).standard_normal((m, k)), mx.float32)


@pytest.mark.parametrize("fast", [True, False])
def test_affine_qmv(agreement, fast) -> None:
    # qmv: 2 SIMD-groups of 32 threads, 4 output rows each (bn = 8); threadgroups
    # (M, ceil(N / 8), B). The fast kernel needs N % 8 == 0 and K % 512 == 0 (4 bits).
    m, n, k = 3, (24 if fast else 20), (512 if fast else 320)
    _, (wq, scales, biases) = _weights(n, k)
    x = _x(m, k)
    function = "affine_qmv_fast" if fast else "affine_qmv"
    built = build(metal_library(*AFFINE), function, (mx.float32, 64, 4, False))
    out = run_both(built.kernel,
                   buffers={"w": wq, "scales": scales, "biases": biases, "x": x,
                            "y": new_buffer((m, n)), "in_vec_size": k, "out_vec_size": n,
                            **UNBATCHED, "b_strides": _NONE.astype(np.int64)},
                   threadgroups=(m, ceil_div(n, 8), 1), threads_per_threadgroup=(32, 2, 1))
    expected = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=64, bits=4)
    agreement(f"{function}<float32, 64, 4>", MLX, out.mx("y"), expected,
              reference="mx.quantized_matmul (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-4)


def test_affine_qvm(agreement) -> None:
    # x @ w (not transposed): qvm, 2 SIMD-groups, bn = min(group_size, 32) * 2 = 64
    # outputs a threadgroup.
    m, n, k = 2, 192, 128  # w is (K, N), quantized along N
    _, (wq, scales, biases) = _weights(k, n)
    x = _x(m, k)
    built = build(metal_library(*AFFINE), "affine_qvm", (mx.float32, 64, 4, False))
    out = run_both(built.kernel,
                   buffers={"w": wq, "scales": scales, "biases": biases, "x": x,
                            "y": new_buffer((m, n)), "in_vec_size": k, "out_vec_size": n,
                            **UNBATCHED, "b_strides": _NONE.astype(np.int64)},
                   threadgroups=(m, ceil_div(n, 64), 1), threads_per_threadgroup=(32, 2, 1))
    expected = mx.quantized_matmul(x, wq, scales, biases, transpose=False, group_size=64,
                                   bits=4)
    agreement("affine_qvm<float32, 64, 4>", MLX, out.mx("y"), expected,
              reference="mx.quantized_matmul (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("transpose", [True, False])
def test_affine_qmm(agreement, transpose) -> None:
    # qmm: 32 x 32 tiles, 2 x 2 SIMD-groups, threadgroups (ceil(N / 32), ceil(M / 32), B);
    # qmm_t takes aligned_N = N % 32 == 0.
    m, n, k = 40, (48 if transpose else 64), 128
    _, (wq, scales, biases) = _weights(n, k) if transpose else _weights(k, n)
    x = _x(m, k)
    if transpose:
        function, template = "affine_qmm_t", (mx.float32, 64, 4, n % 32 == 0, False)
    else:
        function, template = "affine_qmm_n", (mx.float32, 64, 4, False)
    built = build(metal_library(*AFFINE), function, template)
    out = run_both(built.kernel,
                   buffers={"w": wq, "scales": scales, "biases": biases, "x": x,
                            "y": new_buffer((m, n)), "K": k, "N": n, "M": m,
                            **UNBATCHED, "b_strides": _NONE.astype(np.int64)},
                   threadgroups=(ceil_div(n, 32), ceil_div(m, 32), 1),
                   threads_per_threadgroup=(32, 2, 2))
    expected = mx.quantized_matmul(x, wq, scales, biases, transpose=transpose, group_size=64,
                                   bits=4)
    agreement(f"{function}<float32, 64, 4>", MLX, out.mx("y"), expected,
              reference="mx.quantized_matmul (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-4)


def test_affine_quantize_dequantize(agreement) -> None:
    # quantize_impl: quantize with group_size / 32 = 2 values a thread (a SIMD-group a
    # group), dequantize with packs_per_int = 8 / bits = 2 outputs a thread.
    n, k, group_size, bits = 8, 256, 64, 4
    w = mx.array(rng().standard_normal((n, k)), mx.float32)
    lib = metal_library(*AFFINE)
    quantize = build(lib, "affine_quantize", (mx.float32, group_size, bits))
    per_thread = group_size // 32
    threads = w.size // per_thread
    q = run_both(quantize.kernel,
                 buffers={"w": w, "out": new_buffer((n, k * bits // 8), mx.uint8),
                          "scales": new_buffer((n, k // group_size)),
                          "biases": new_buffer((n, k // group_size))},
                 grid=(threads, 1), threads_per_threadgroup=(min(threads, 1024), 1))
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    agreement("affine_quantize<float32, 64, 4> scales", MLX, q.mx("scales"), scales,
              reference="mx.quantize (CPU)", compile_s=quantize.compile_s, bitwise=True)
    agreement("affine_quantize<float32, 64, 4> biases", MLX, q.mx("biases"), biases,
              reference="mx.quantize (CPU)", compile_s=quantize.compile_s, bitwise=True)
    agreement("affine_quantize<float32, 64, 4> weights", MLX, q["out"].view(np.uint32),
              wq, reference="mx.quantize (CPU)", compile_s=quantize.compile_s, bitwise=True)
    dequantize = build(lib, "affine_dequantize", (mx.float32, group_size, bits))
    packs = 8 // bits
    threads = w.size // packs
    d = run_both(dequantize.kernel,
                 buffers={"w": np.asarray(wq).view(np.uint8), "scales": scales,
                          "biases": biases, "out": new_buffer((n, k))},
                 grid=(threads, 1), threads_per_threadgroup=(min(threads, 1024), 1))
    agreement("affine_dequantize<float32, 64, 4>", MLX, d.mx("out"),
              mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits),
              reference="mx.dequantize (CPU)", compile_s=dequantize.compile_s, bitwise=True)


FP_BUFFERS = {"global_scale": np.ones(1, np.float32)}  # unread without has_global_scale


@pytest.mark.parametrize(("mode", "fast"), [("mxfp4", False), ("nvfp4", True),
                                            ("mxfp8", True)])
def test_fp_qmv(agreement, mode, fast) -> None:
    # The floating-point modes through qmv: fp_qmv(_fast)<T, group_size, bits, batched>,
    # the same geometry as affine; scales are uint8 (e8m0 for mx*, e4m3 for nvfp4).
    group_size, bits = FP_MODES[mode]
    m, n, k = 2, (24 if fast else 20), 512
    _, (wq, scales) = _weights(n, k, mode, group_size, bits)
    x = _x(m, k)
    function = "fp_qmv_fast" if fast else "fp_qmv"
    built = build(metal_library(*FP), function, (mx.float32, group_size, bits, False))
    out = run_both(built.kernel,
                   buffers={"w": wq, "scales": scales, **FP_BUFFERS, "x": x,
                            "y": new_buffer((m, n)), "in_vec_size": k, "out_vec_size": n,
                            **UNBATCHED},
                   threadgroups=(m, ceil_div(n, 8), 1), threads_per_threadgroup=(32, 2, 1))
    expected = mx.quantized_matmul(x, wq, scales, transpose=True, group_size=group_size,
                                   bits=bits, mode=mode)
    agreement(f"{function}<float32, {group_size}, {bits}> ({mode})", MLX, out.mx("y"),
              expected, reference="mx.quantized_matmul (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-4)


def test_fp_qmm_t(agreement) -> None:
    # mxfp4 through qmm_t: 32 x 32 tiles as for affine.
    group_size, bits = FP_MODES["mxfp4"]
    m, n, k = 33, 64, 128
    _, (wq, scales) = _weights(n, k, "mxfp4", group_size, bits)
    x = _x(m, k)
    built = build(metal_library(*FP), "fp_qmm_t", (mx.float32, group_size, bits, True, False))
    out = run_both(built.kernel,
                   buffers={"w": wq, "scales": scales, **FP_BUFFERS, "x": x,
                            "y": new_buffer((m, n)), "K": k, "N": n, "M": m, **UNBATCHED},
                   threadgroups=(ceil_div(n, 32), ceil_div(m, 32), 1),
                   threads_per_threadgroup=(32, 2, 2))
    expected = mx.quantized_matmul(x, wq, scales, transpose=True, group_size=group_size,
                                   bits=bits, mode="mxfp4")
    agreement("fp_qmm_t<float32, 32, 4> (mxfp4)", MLX, out.mx("y"), expected,
              reference="mx.quantized_matmul (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-4)
