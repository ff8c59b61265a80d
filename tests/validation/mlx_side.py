"""MLX's kernels of a published version, from that version's macOS wheel, dispatched as
that version's host code (ml-explore/mlx ``mlx/backend/metal/*.cpp`` at its tag) did.

A `.metal` file of MLX's includes its headers and lists instantiations; the wheel ships
only the headers (`published.mlx_include`), so `library` loads the last header with the
ones before it as its prelude, as the `.metal` file includes them, all from the version's
own folder (never the installed mlx's).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.gpu import Counters, scaled

from . import published

KERNELS = "mlx/backend/metal/kernels"
_NONE = np.zeros(1, np.int32)
# Unbatched calls leave the batch buffers unbound (add_strides_and_shapes skipped);
# mtwork binds every buffer the signature names, so they get placeholders.
UNBATCHED = {"x_batch_ndims": 0, "x_shape": _NONE, "x_strides": _NONE.astype(np.int64),
             "w_batch_ndims": 0, "w_shape": _NONE, "w_strides": _NONE.astype(np.int64),
             "s_strides": _NONE.astype(np.int64), "b_strides": _NONE.astype(np.int64)}
QUANTIZED = ("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "quantized.h")


@cache
def library(version: str, headers: tuple[str, ...]) -> mtwork.Library:
    """The library a `.metal` file of `version` makes from `headers` (paths under the
    kernels folder, in its include order): its include lines, resolved in the version's
    own folder."""
    include = published.mlx_include(version)
    text = "".join(f'#include "{KERNELS}/{h}"\n' for h in headers)
    name = f"mlx-{version}-" + headers[-1].rsplit("/", 1)[-1].removesuffix(".h") + ".metal"
    # Before 0.26 utils.h includes "bf16.h" from the folder of the Metal version MLX was
    # built for (its build passes -I kernels/metal_3_1 for Metal 3.1, macOS 14: the
    # wheel's platform).
    versioned = include / KERNELS / "metal_3_1"
    dirs = [include, versioned] if versioned.is_dir() else [include]
    return mtwork.load_metal(text, include_dirs=dirs, name=name)


@cache
def kernel(version: str, headers: tuple[str, ...], function: str, template: Any = None,
           constants: tuple[tuple[str | int, Any], ...] = ()) -> mtwork.Kernel:
    lib = library(version, headers)
    # The host code sets the constants its version declares (do_gather came and went).
    known = {name: value for name, value in constants if name in lib.function_constants}
    k = lib.kernel(function, template=template, constants=known or None)
    return k.compile()


def quantized(rows: int, cols: int, *, bits: int = 4, group_size: int = 64,
              dtype: mx.Dtype = mx.bfloat16, seed: int = 0) -> tuple[mx.array, ...]:
    """`mx.quantize` of a random rows x cols matrix: (weights, scales, biases)."""
    w = mx.array(np.random.default_rng(seed).standard_normal((rows, cols)), dtype)
    return tuple(mx.quantize(w, group_size=group_size, bits=bits))


def vectors(m: int, cols: int, dtype: mx.Dtype = mx.bfloat16, seed: int = 1) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((m, cols)), dtype)


def qmv(version: str, m: int, n: int, k: int, *, bits: int = 4, group_size: int = 64,
        dtype: mx.Dtype = mx.bfloat16, wide: bool = False, slice_rows: int = 512
        ) -> Counters:
    """`x @ w.T` for m vectors against an n x k affine-quantized w, unbatched, as
    quantized.cpp dispatches it: `qmv` (grid (m, n / 8, 1) of 32 x 2 threads, the fast
    kernel when n % 8 == 0 and k % 512 == 0) or, with `wide`, `qmv_wide` (0.32: tiles of
    at most 5 vectors, vecs_per_tg = ceil(m / ceil(m / 5)), k_lanes 8, two SIMD-groups of
    4 rows each: grid (ceil(m / vecs_per_tg), ceil(n / 8), 1)). Profiled on `slice_rows`
    rows of w and scaled to n (each threadgroup's 8 rows are its own; x is shared)."""
    if n % slice_rows or slice_rows % 8:
        raise ValueError(f"n={n} must be a multiple of slice_rows={slice_rows}, itself of 8")
    w, scales, biases = quantized(slice_rows, k, bits=bits, group_size=group_size,
                                  dtype=dtype)
    x = vectors(m, k, dtype)
    buffers = {"w": w, "scales": scales, "biases": biases, "x": x,
               "y": mtwork.new_buffer((m, slice_rows), dtype), "in_vec_size": k,
               "out_vec_size": slice_rows, **UNBATCHED}
    if wide:
        tiles = (m + 4) // 5
        vecs = -(-m // tiles)
        k_ = kernel(version, QUANTIZED, "affine_qmv_wide",
                    (dtype, group_size, bits, vecs, 8, False))
        buffers["M"] = m
        groups = (-(-m // vecs), slice_rows // 8, 1)
    else:
        fast = k % 512 == 0
        k_ = kernel(version, QUANTIZED, "affine_qmv_fast" if fast else "affine_qmv",
                    (dtype, group_size, bits, False))
        groups = (m, slice_rows // 8, 1)
    launch = k_.launch(buffers=buffers, threadgroups=groups, threads_per_threadgroup=(32, 2, 1))
    return scaled(mtwork.profile(launch), n // slice_rows, shared=("x",))


QUANTIZED_0_19 = ("utils.h", "steel/gemm/gemm.h", "quantized.h")


def qmv_kv_cache(quad: bool, *, heads: int = 32, keys: int = 32768, dim: int = 128,
                 slice_keys: int = 2048, dtype: mx.Dtype = mx.float32) -> Counters:
    """mlx 0.19.3: one query a head against a 4-bit quantized key cache,
    quantized_matmul(q (1, 8, 4, 1, 128), k (1, 8, 4, 32768, 128), transpose=True), as
    quantized.cpp's qmm_op dispatches it batched (w has batch dimensions): D = 128,
    O = 32768, B = 1, N = 32 heads. `quad`: qmv_quad<T, 64, 4, D=128, batched> with grid
    (O / 64, B, N) of 32 threads; else qmv (the kernel the specialisation replaced for
    D = 64 and 128) with grid (O / 8, B, N) of 32 x 2 threads. Profiled on one head's
    `slice_keys` keys and scaled to all (the query's lines are counted once a slice)."""
    w, scales, biases = quantized(slice_keys, dim, dtype=dtype)
    x = vectors(1, dim, dtype)
    shape = np.array([1, 1, 1, 1, dim], np.int32)
    buffers = {"w": w, "scales": scales, "biases": biases, "x": x,
               "y": mtwork.new_buffer((1, slice_keys), dtype), "in_vec_size": dim,
               "out_vec_size": slice_keys, "x_batch_ndims": 3, "x_shape": shape,
               "x_strides": np.array([dim, dim, dim, dim, 1], np.uint64),  # size_t in 0.19
               "w_batch_ndims": 3, "w_shape": np.array([1, 1, 1, slice_keys, dim // 8],
                                                       np.int32),
               "w_strides": np.array([slice_keys * dim // 8] * 3 + [dim // 8, 1], np.uint64),
               "s_strides": np.array([slice_keys * dim // 64] * 3 + [dim // 64, 1], np.uint64),
               "b_strides": np.array([slice_keys * dim // 64] * 3 + [dim // 64, 1], np.uint64)}
    if quad:
        k = kernel("0.19.3", QUANTIZED_0_19, "qmv_quad", (dtype, 64, 4, dim, True))
        launch = k.launch(buffers=buffers, threadgroups=(slice_keys // 64, 1, 1),
                          threads_per_threadgroup=(32, 1, 1))
    else:
        k = kernel("0.19.3", QUANTIZED_0_19, "qmv", (dtype, 64, 4, True))
        launch = k.launch(buffers=buffers, threadgroups=(slice_keys // 8, 1, 1),
                          threads_per_threadgroup=(32, 2, 1))
    return scaled(mtwork.profile(launch), heads * keys // slice_keys, shared=("x",))


def block_sort_geometry(version: str, size: int) -> tuple[int, int]:
    """sort.cpp's (bn, tn) for a sorted axis of `size` (gpu_merge_sort): 0.21 takes 8
    elements a thread and bn from 128 to 512; 0.22 (#1831) takes 4 and bn from 32."""
    tn = 8 if version < "0.22" else 4
    floor = 128 if tn == 8 else 32
    needed = -(-size // tn)
    bn = next((b for b in (32, 64, 128, 256) if b >= floor and needed <= b), 512)
    if bn * tn < size:
        raise ValueError(f"a row of {size} needs the multi-block sort, not modelled here")
    return bn, tn


def block_sort(version: str, rows: int, size: int, *, slice_rows: int = 64,
               dtype: mx.Dtype = mx.float32) -> Counters:
    """mx.sort over the last axis of a contiguous (rows, size) array, one block a row:
    sort.cpp's single_block_sort, block_sort<T, T, false, bn, tn> with grid (1, rows, 1)
    of bn threads. Profiled on `slice_rows` rows (each a threadgroup of its own)."""
    bn, tn = block_sort_geometry(version, size)
    part = min(rows, slice_rows)
    if rows % part:  # (a single row is its own slice)
        raise ValueError(f"rows={rows} must be a multiple of {part}")
    x = mx.array(np.random.default_rng(0).standard_normal((part, size)), dtype)
    k = kernel(version, ("utils.h", "sort.h"), "block_sort", (dtype, dtype, False, bn, tn))
    launch = k.launch(buffers={"inp": x, "out": mtwork.new_buffer(x.shape, dtype),
                               "size_sorted_axis": size, "in_stride_sorted_axis": 1,
                               "out_stride_sorted_axis": 1, "in_stride_segment_axis": size,
                               "out_stride_segment_axis": size},
                      threadgroups=(1, part, 1), threads_per_threadgroup=(bn, 1, 1))
    return scaled(mtwork.profile(launch), rows // part)


GEMM_PARAMS = np.dtype(  # steel/gemm/params.h, GEMMParams with C's alignment
    [("M", "i4"), ("N", "i4"), ("K", "i4"), ("lda", "i4"), ("ldb", "i4"), ("ldd", "i4"),
     ("tiles_n", "i4"), ("tiles_m", "i4"), ("batch_stride_a", "i8"), ("batch_stride_b", "i8"),
     ("batch_stride_d", "i8"), ("swizzle_log", "i4"), ("gemm_k_iterations_aligned", "i4"),
     ("batch_ndim", "i4")], align=True)
STEEL_FUSED = ("utils.h", "steel/gemm/gemm.h", "steel/gemm/kernels/steel_gemm_fused.h")


def steel_gemm(version: str, batch: int, m: int, n: int, k: int, *, nt: bool = False,
               tiles: tuple[int, int, int, int, int] = (64, 64, 16, 2, 2),
               dtype: mx.Dtype = mx.float32, swizzle_log: int = 0,
               slice_tiles: int = 1) -> Counters:
    """A (batch, m, k) @ B (k, n) (or B.T from (n, k) with `nt`) through matmul.cpp's
    steel_matmul_regular: gemm<T, bm, bn, bk, wm, wn, false, nt> with the function
    constants it sets (no batch, no bias, align_* where the sizes are whole tiles), grid
    (tiles_n << swizzle_log, ceil(tiles_m / 2**swizzle_log), batch) of 32 x wn x wm
    threads (the swizzled grid's threadgroups past the last tile row return at once).
    `tiles` is (bm, bn, bk, wm, wn), chosen by the version's host code for the shape and
    chip. Profiled on `slice_tiles` tiles of one tile row (the full K) and scaled to all;
    A, B and D are read or written whole, so their distinct lines are their sizes."""
    bm, bn, bk, wm, wn = tiles
    tiles_m = -(-m // bm)
    if n % (bn * slice_tiles) or k % bk or (tiles_m > 1 and m % bm):
        raise ValueError(f"{m}x{n}x{k}: n must be whole slices of {slice_tiles} {bn}-wide "
                         f"tiles, k whole {bk}-steps, m one partial tile or whole ones")
    g = np.random.default_rng(0)
    sm, sn = min(m, bm), bn * slice_tiles
    a = mx.array(g.standard_normal((sm, k)), dtype)
    b = mx.array(g.standard_normal((sn, k) if nt else (k, sn)), dtype)
    params = np.array([(sm, sn, k, k, k if nt else sn, sn, slice_tiles, 1, 0, 0, 0,
                        swizzle_log, k // bk, 1)], GEMM_PARAMS)
    kern = kernel(version, STEEL_FUSED, "gemm", (dtype, bm, bn, bk, wm, wn, False, nt),
                  (("has_batch", False), ("use_out_source", False), ("do_axpby", False),
                   ("align_M", m % bm == 0), ("align_N", True), ("align_K", True),
                   ("do_gather", False)))
    launch = kern.launch(buffers={"A": a, "B": b, "D": mtwork.new_buffer((sm, sn), dtype),
                                  "params": params, "batch_shape": np.array([1], np.int32),
                                  "batch_strides": strides(kern, "batch_strides", [0, 0])},
                         threadgroups=(slice_tiles << swizzle_log, 1, 1),
                         threads_per_threadgroup=(32, wn, wm))
    size = dtype.size
    granules = {name: -(-elements * size // 64) for name, elements in
                (("A", batch * m * k), ("B", k * n), ("D", batch * m * n))}
    copies = batch * max(1, m // sm) * (n // sn)
    return scaled(mtwork.profile(launch), copies, distinct_lines=granules)


SPLITK_PARAMS = np.dtype([(name, "i4") for name in (
    "M", "N", "K", "lda", "ldb", "ldc", "tiles_n", "tiles_m", "split_k_partitions",
    "split_k_partition_stride", "split_k_partition_size", "swizzle_log",
    "gemm_k_iterations_aligned")])
STEEL_SPLITK = ("utils.h", "steel/gemm/gemm.h", "steel/gemm/kernels/steel_gemm_splitk.h")


def steel_splitk(version: str, m: int, n: int, k: int, *, nt: bool = True,
                 dtype: mx.Dtype = mx.bfloat16) -> list[tuple[Counters, int]]:
    """matmul.cpp's steel_gemm_splitk_axpby (0.30.5 and later): bm = 16 if m < 40 else 32,
    bn likewise, bk 16, 2 x 2 SIMD-groups; min(max(2, next_power_of_2(k / 16 /
    (ceil(m / 32) ceil(n / 32)))), 32) partitions of k, each a float32 slice of the
    output: gemm_splitk<T, float, ...> over grid (tiles_n, tiles_m, partitions), then
    gemm_splitk_accum<float, T> over the m x n outputs (dispatchThreads, MLX's
    get_block_dims). Two dispatches, profiled whole."""
    bm, bn, bk, wm, wn = (16 if m < 40 else 32), (16 if n < 40 else 32), 16, 2, 2
    tiles_work = -(-m // 32) * -(-n // 32)
    partitions = min(max(2, next_power_of_2((k // 16) // tiles_work)), 32)
    iterations = (k // bk) // partitions
    tn, tm = -(-n // bn), -(-m // bm)
    g = np.random.default_rng(0)
    a = mx.array(g.standard_normal((m, k)), dtype)
    b = mx.array(g.standard_normal((n, k) if nt else (k, n)), dtype)
    params = np.array([(m, n, k, k, k if nt else n, n, tn, tm, partitions, m * n,
                        iterations * bk, 0, iterations)], SPLITK_PARAMS)
    aligned = m % bm == 0 and n % bn == 0
    split = kernel(version, STEEL_SPLITK, "gemm_splitk",
                   (dtype, mx.float32, bm, bn, bk, wm, wn, False, nt, aligned, k % bk == 0))
    c_split = mtwork.new_buffer((partitions, m, n), mx.float32)
    first = split.launch(buffers={"A": a, "B": b, "C": c_split, "params": params},
                         threadgroups=(tn, tm, partitions), threads_per_threadgroup=(32, wn, wm))
    counted = [mtwork.profile(first)]
    partial = np.zeros((partitions, m, n), np.float32)
    accum = kernel(version, STEEL_SPLITK, "gemm_splitk_accum", (mx.float32, dtype))
    second = accum.launch(buffers={"C_split": partial, "D": mtwork.new_buffer((m, n), dtype),
                                   "k_partitions": partitions, "partition_stride": m * n,
                                   "ldd": n},
                          grid=(n, m, 1), threads_per_threadgroup=block_dims(n, m, 1))
    counted.append(mtwork.profile(second))
    return [(c, 1) for c in counted]


GEMV = ("utils.h", "gemv.h")


def gemv_wide(version: str, m: int, n: int, k: int, *, dtype: mx.Dtype = mx.bfloat16,
              slice_rows: int = 256) -> Counters:
    """x (m, k) @ w.T for w (n, k) through matmul.cpp's gemv_wide (0.32.1, M3 and later):
    one pass for m <= 5 (vecs_per_tg = m, 32 lanes along k, a full SIMD-group a row of 4),
    gemv_wide<T, m, 32> with no batch and no bias over grid (1, ceil(n / 4), 1) of
    32 x 4 threads. Profiled on `slice_rows` rows of w and scaled (x is shared)."""
    rows = min(n, slice_rows)
    if n % rows or rows % 4 or m > 5:
        raise ValueError(f"n={n} must be whole slices of {rows} rows (a multiple of 4); "
                         f"m={m} at most 5")
    g = np.random.default_rng(0)
    w = mx.array(g.standard_normal((rows, k)), dtype)
    x = mx.array(g.standard_normal((m, k)), dtype)
    kern = kernel(version, GEMV, "gemv_wide", (dtype, m, 32),
                  (("gemv_wide_has_batch", False), ("gemv_wide_do_axpby", False)))
    declared = {p.name for p in kern.program.params if p.kind == "buffer"}
    values = {"mat": w, "in_vec": x, "out_vec": mtwork.new_buffer((m, rows), dtype),
              "in_vec_size": k, "out_vec_size": rows, "M": m, "matrix_ld": k, "vector_ld": k,
              "batch_ndim": 1, "batch_shape": np.array([1], np.int32),
              "vector_batch_stride": np.array([0], np.int64),
              "matrix_batch_stride": np.array([0], np.int64)}
    launch = kern.launch(buffers={name: values[name] for name in declared & set(values)},
                         threadgroups=(1, rows // 4, 1), threads_per_threadgroup=(32, 4, 1))
    return scaled(mtwork.profile(launch), n // rows, shared=("in_vec",))


def strides(kern: mtwork.Kernel, name: str, values: list[int]) -> np.ndarray:
    """Strides as the kernel's parameter declares them (size_t before 0.20, int64_t
    since)."""
    declared = next(p.type_text for p in kern.program.params if p.name == name)
    return np.array(values, np.int64 if "int64_t" in declared else np.uint64)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_dims(dim0: int, dim1: int, dim2: int) -> tuple[int, int, int]:
    """MLX's get_block_dims (backend/common/utils.cpp): a power of two per dimension,
    grown in turn while the dimension is at least twice as large, up to 1024 threads."""
    pows, total = [0, 0, 0], 0
    dims = (dim0, dim1, dim2)
    while True:
        before = total
        for axis in range(3):
            if dims[axis] >= 1 << (pows[axis] + 1):
                pows[axis] += 1
                total += 1
            if total == 10:
                return (1 << pows[0], 1 << pows[1], 1 << pows[2])
        if total == before:
            return (1 << pows[0], 1 << pows[1], 1 << pows[2])
