"""MLX's steel GEMM family (steel/gemm/kernels/: fused, split-K, gather) and steel
attention on `sim`, against `@`, `mx.gather_mm` and `mx.fast.scaled_dot_product_attention`
on the CPU.

The libraries are written as the `.metal` files write them (steel_gemm_fused.metal
includes utils.h, steel/gemm/gemm.h, then the kernel header), so the function constants
they declare (`has_batch`, `align_M`, ...) come from MLX's headers themselves. Template
arguments are instantiations of those files; tiles, parameter structs and grids follow
matmul.cpp (`steel_matmul_regular`, `steel_gemm_splitk_axpby`, `gather_mm`) and
scaled_dot_product_attention.cpp.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, block_dims, build, ceil_div, metal_library, next_power_of_2, rng

GEMM = ("utils.h", "steel/gemm/gemm.h")

# steel/gemm/params.h, laid out with C's alignment rules.
GEMM_PARAMS = np.dtype(
    [("M", "i4"), ("N", "i4"), ("K", "i4"), ("lda", "i4"), ("ldb", "i4"), ("ldd", "i4"),
     ("tiles_n", "i4"), ("tiles_m", "i4"), ("batch_stride_a", "i8"), ("batch_stride_b", "i8"),
     ("batch_stride_d", "i8"), ("swizzle_log", "i4"), ("gemm_k_iterations_aligned", "i4"),
     ("batch_ndim", "i4")], align=True)
SPLITK_PARAMS = np.dtype([(name, "i4") for name in (
    "M", "N", "K", "lda", "ldb", "ldc", "tiles_n", "tiles_m", "split_k_partitions",
    "split_k_partition_stride", "split_k_partition_size", "swizzle_log",
    "gemm_k_iterations_aligned")])


def _matrices(*shapes: tuple[int, ...]) -> list[mx.array]:
    g = rng()
    return [mx.array(g.standard_normal(s), mx.float32) for s in shapes]


@pytest.mark.parametrize(("batch", "m", "n", "k"), [(1, 64, 64, 32), (2, 45, 38, 37)])
def test_steel_gemm_fused(agreement, batch, m, n, k) -> None:
    # steel_matmul_regular: BM x BN tiles with 32 x WN x WM threads, one threadgroup per
    # tile and batch element; align_* say whether M, N, K are whole tiles.
    bm, bn, bk, wm, wn = 32, 32, 16, 2, 2
    a, b = _matrices((batch, m, k), (batch, k, n))
    tiles_n, tiles_m = ceil_div(n, bn), ceil_div(m, bm)
    params = np.array([(m, n, k, k, n, n, tiles_n, tiles_m, m * k, k * n, m * n, 0, k // bk, 1)],
                      dtype=GEMM_PARAMS)
    built = build(metal_library(*GEMM, "steel/gemm/kernels/steel_gemm_fused.h"), "gemm",
                  (mx.float32, bm, bn, bk, wm, wn, False, False),
                  {"has_batch": False, "use_out_source": False, "do_axpby": False,
                   "align_M": m % bm == 0, "align_N": n % bn == 0, "align_K": k % bk == 0})
    out = run_both(built.kernel,
                   buffers={"A": a, "B": b, "D": new_buffer((batch, m, n)), "params": params},
                   threadgroups=(tiles_n, tiles_m, batch), threads_per_threadgroup=(32, wn, wm))
    agreement(f"steel gemm fused {batch}x{m}x{n}x{k}", MLX, out.mx("D"), a @ b,
              reference="matmul (CPU)", compile_s=built.compile_s, atol=1e-4, rtol=1e-4)


def test_steel_gemm_splitk(agreement) -> None:
    # A long K and a small output: gemm_splitk into split_k_partitions float32 slices
    # (next_power_of_2(K / 16 / (tiles_m * tiles_n)), 2 to 32), then gemm_splitk_accum
    # sums them over an (N, M) grid in get_block_dims threadgroups.
    m, n, k = 20, 24, 1024
    a, b = _matrices((m, k), (k, n))
    bm, bn, bk, wm, wn = 16, 16, 16, 2, 2  # M, N < 40
    partitions = min(max(2, next_power_of_2(k // 16 // (ceil_div(m, 32) * ceil_div(n, 32)))), 32)
    k_iters = (k // bk) // partitions
    tiles_n, tiles_m = ceil_div(n, bn), ceil_div(m, bm)
    params = np.array([(m, n, k, k, n, n, tiles_n, tiles_m, partitions, m * n, k_iters * bk, 0,
                        k_iters)], dtype=SPLITK_PARAMS)
    lib = metal_library(*GEMM, "steel/gemm/kernels/steel_gemm_splitk.h")
    split = build(lib, "gemm_splitk", (mx.float32, mx.float32, bm, bn, bk, wm, wn, False, False,
                                       m % bm == 0 and n % bn == 0, k % bk == 0))
    partial = run_both(split.kernel,
                       buffers={"A": a, "B": b, "C": new_buffer((partitions, m, n)),
                                "params": params},
                       threadgroups=(tiles_n, tiles_m, partitions),
                       threads_per_threadgroup=(32, wn, wm))["C"]
    accum = build(lib, "gemm_splitk_accum", (mx.float32, mx.float32))
    out = run_both(accum.kernel,
                   buffers={"C_split": partial, "D": new_buffer((m, n)), "k_partitions": partitions,
                            "partition_stride": m * n, "ldd": n},
                   grid=(n, m, 1), threads_per_threadgroup=block_dims(n, m, 1))
    agreement(f"steel gemm split-K {m}x{n}x{k} ({partitions} partitions)", MLX, out.mx("D"),
              a @ b, reference="matmul (CPU)", compile_s=split.compile_s + accum.compile_s,
              atol=1e-4, rtol=1e-4)


def test_steel_gather_mm(agreement) -> None:
    # gather_mm: 64 x 64 x 16 tiles, 2 x 2 SIMD-groups, one threadgroup per tile and
    # output matrix; lhs_indices / rhs_indices pick a's and b's matrices.
    m, n, k, batch = 40, 50, 30, 5
    a, b = _matrices((3, m, k), (4, k, n))
    g = rng()
    lhs = mx.array(g.integers(0, 3, batch), mx.uint32)
    rhs = mx.array(g.integers(0, 4, batch), mx.uint32)
    bm, bn, bk, wm, wn = 64, 64, 16, 2, 2
    tiles_n, tiles_m = ceil_div(n, bn), ceil_div(m, bm)
    params = np.array([(m, n, k, k, n, n, tiles_n, tiles_m, 1, 1, m * n, 0, k // bk, 1)],
                      dtype=GEMM_PARAMS)
    built = build(metal_library(*GEMM, "steel/gemm/kernels/steel_gemm_gather.h"), "gather_mm",
                  (mx.float32, bm, bn, bk, wm, wn, False, False),
                  {"has_batch": False, "align_M": m % bm == 0, "align_N": n % bn == 0,
                   "align_K": k % bk == 0})
    out = run_both(built.kernel,
                   buffers={"A": a, "B": b, "lhs_indices": lhs, "rhs_indices": rhs,
                            "C": new_buffer((batch, m, n)), "params": params,
                            "indices_shape": np.array([batch], np.int32),
                            "lhs_strides": np.array([1], np.int64),
                            "rhs_strides": np.array([1], np.int64), "batch_ndim_a": 1,
                            "batch_shape_a": np.array([3], np.int32),
                            "batch_strides_a": np.array([m * k], np.int64), "batch_ndim_b": 1,
                            "batch_shape_b": np.array([4], np.int32),
                            "batch_strides_b": np.array([k * n], np.int64)},
                   threadgroups=(tiles_n, tiles_m, batch), threads_per_threadgroup=(32, wn, wm))
    expected = mx.gather_mm(a, b, lhs_indices=lhs, rhs_indices=rhs)
    agreement("steel gather_mm 5 of (3, 4) matrices", MLX, out.mx("C"), expected,
              reference="mx.gather_mm (CPU)", compile_s=built.compile_s, atol=1e-4, rtol=1e-4)


ATTN_PARAMS = np.dtype(
    [("B", "i4"), ("H", "i4"), ("D", "i4"), ("qL", "i4"), ("kL", "i4"), ("gqa_factor", "i4"),
     ("scale", "f4"), ("NQ", "i4"), ("NK", "i4"), ("NQ_aligned", "i4"), ("NK_aligned", "i4"),
     ("qL_rem", "i4"), ("kL_rem", "i4"), ("qL_off", "i4"), ("Q_strides", "i8", 3),
     ("K_strides", "i8", 3), ("V_strides", "i8", 3), ("O_strides", "i8", 3)],
    align=True,
)  # steel/attn/params.h AttnParams


@pytest.mark.parametrize("variant", ["plain", "causal", "sinks"])
def test_steel_attention(agreement, variant) -> None:
    # Full attention: query blocks of BQ rows, key blocks of BK, WM x WN SIMD-groups;
    # threadgroups (query blocks, heads, batch); align_Q / align_K say whether the
    # lengths are whole blocks; causal queries are the last qL of the kL positions.
    b, hq, hkv, q_len, k_len, d = 1, 4, 2, 40, 45, 64
    bq, bk, wm, wn = 32, 16, 4, 1
    q, k, v = _matrices((b, hq, q_len, d), (b, hkv, k_len, d), (b, hkv, k_len, d))
    scale = d**-0.5
    nq, nk = ceil_div(q_len, bq), ceil_div(k_len, bk)

    def strides(x: mx.array) -> tuple[int, int, int]:
        return (x.shape[1] * x.shape[2] * d, x.shape[2] * d, d)

    params = np.array([(b, hq, d, q_len, k_len, hq // hkv, scale, nq, nk, q_len // bq,
                        k_len // bk, q_len % bq, k_len % bk, k_len - q_len, strides(q),
                        strides(k), strides(v), strides(q))], dtype=ATTN_PARAMS)
    buffers = {"Q": q, "K": k, "V": v, "O": new_buffer(q.shape), "params": params}
    sinks = None
    if variant == "sinks":
        sinks = mx.array(rng().standard_normal(hq), dtype=mx.float32)
        buffers["sinks"] = sinks
    built = build(metal_library("utils.h", "steel/attn/kernels/steel_attention.h"), "attention",
                  (mx.float32, bq, bk, d, d, wm, wn),
                  {"align_Q": q_len % bq == 0, "align_K": k_len % bk == 0, "has_mask": False,
                   "do_causal": variant == "causal", "has_sinks": variant == "sinks",
                   "save_lse": False})
    out = run_both(built.kernel, buffers=buffers, threadgroups=(nq, hq, b),
                   threads_per_threadgroup=(32, wm, wn))
    expected = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask="causal" if variant == "causal" else None, sinks=sinks)
    agreement(f"steel attention ({variant})", MLX, out.mx("O"), expected,
              reference="mx.fast.scaled_dot_product_attention (CPU)",
              compile_s=built.compile_s, atol=1e-4, rtol=1e-4)
