"""MLX's reductions (reduce.h: reduction/reduce_all.h, reduce_row.h, reduce_col.h) on
`sim`, against `mx.sum` / `mx.max` / `mx.min` on the CPU.

Template arguments are those of MLX's reduce.metal (`instantiate_reduce_functions`:
`all_reduce<T, U, Op<U>>`, `row_reduce_small<T, U, Op<U>, int, NDIMS>`, ...); which
kernel runs, its arguments and its geometry follow reduce.cpp (`all_reduce_dispatch`,
`row_reduce_general_dispatch`, `strided_reduce_general_dispatch`) for the shapes chosen,
including the two-pass forms and their intermediate arrays. Max and Min, and sums of
integers, are bitwise whatever the order; float sums are within a tolerance.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, metal_library, rng

HEADERS = ("defines.h", "utils.h", "atomic.h", "reduction/ops.h", "reduce.h")
REDUCE_N_READS = 4  # defines.h
NO_DIMS = {"shape": np.zeros(1, np.int32), "strides": np.zeros(1, np.int64), "ndim": 0}


def _library():
    return metal_library(*HEADERS)


def _floats(shape: tuple[int, ...]) -> np.ndarray:
    return rng().standard_normal(shape).astype(np.float32)


def _ints(shape: tuple[int, ...]) -> np.ndarray:
    return rng().integers(-1000, 1000, shape).astype(np.int32)


def _whole_simd_groups(threads: int) -> int:
    return -(-threads // 32) * 32


def test_all_reduce_one_threadgroup(agreement) -> None:
    # At most REDUCE_N_READS * 1024 elements: one threadgroup of ceil(n / 4) threads,
    # rounded up to whole SIMD-groups; in_size and row_size are both n.
    x = _floats((3000,))
    built = build(_library(), "all_reduce", ("float", "float", "Sum<float>"))
    threads = _whole_simd_groups(-(-x.size // REDUCE_N_READS))
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer((1,), mx.float32),
                                          "in_size": x.size, "row_size": x.size},
                   grid=(threads,), threads_per_threadgroup=(threads,))
    agreement("all_reduce Sum<float32>", MLX, out.mx("out")[0], mx.sum(mx.array(x)),
              reference="mx.sum (CPU)", compile_s=built.compile_s, atol=1e-4, rtol=1e-5)


def test_all_reduce_two_passes(agreement) -> None:
    # Larger inputs (up to 2**26 bytes): a first pass of 32 * 4 rows into an
    # intermediate array, then a second pass of 32 threads over it.
    x = _ints((100_000,))
    n_rows = 32 * REDUCE_N_READS
    row_size = -(-x.size // n_rows)
    threads = _whole_simd_groups(min(-(-row_size // REDUCE_N_READS), 1024))
    built = build(_library(), "all_reduce", ("int", "int", "Sum<int>"))
    first = run_both(built.kernel,
                     buffers={"in": x, "out": new_buffer((n_rows,), mx.int32),
                              "in_size": x.size, "row_size": row_size},
                     grid=(threads, n_rows), threads_per_threadgroup=(threads, 1))
    second = run_both(built.kernel,
                      buffers={"in": first["out"], "out": new_buffer((1,), mx.int32),
                               "in_size": n_rows, "row_size": n_rows},
                      grid=(32,), threads_per_threadgroup=(32,))
    agreement("all_reduce Sum<int32> (two passes)", MLX, second.mx("out")[0],
              mx.sum(mx.array(x)), reference="mx.sum (CPU)", compile_s=built.compile_s,
              bitwise=True)


def _row_args(row_size: int, non_row: int, shape: list[int], strides: list[int],
              reduce_shape: list[int], reduce_strides: list[int]) -> dict:
    """RowReduceArgs::encode: empty shapes are sent as one 0."""
    return {"row_size": row_size, "non_row_reductions": non_row,
            "shape": np.array(shape or [0], np.int32),
            "strides": np.array(strides or [0], np.int64), "ndim": len(shape),
            "reduce_shape": np.array(reduce_shape or [0], np.int32),
            "reduce_strides": np.array(reduce_strides or [0], np.int64),
            "reduce_ndim": len(reduce_shape)}


def test_row_reduce_small(agreement) -> None:
    # Rows of at most 64: row_reduce_small, one thread per output row when there are at
    # most 8 non-row reductions (here 1), the grid get_2d_grid_dims of the output.
    x = _floats((40, 50))
    built = build(_library(), "row_reduce_small", ("float", "float", "Max<float>", "int", 1))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer((40,), mx.float32),
                            **_row_args(50, 1, [40], [50], [], [])},
                   grid=(40,), threads_per_threadgroup=(40,))
    agreement("row_reduce_small Max<float32>", MLX, out.mx("out"), mx.max(mx.array(x), -1),
              reference="mx.max (CPU)", compile_s=built.compile_s, bitwise=True)


def test_row_reduce_simple(agreement) -> None:
    # A contiguous reduction of the last axis with at least 32 rows: row_reduce_simple,
    # REDUCE_N_WRITES = 4 rows a threadgroup of threadgroup_size_from_row_size(1000) =
    # 128 threads.
    x = _floats((64, 1000))
    built = build(_library(), "row_reduce_simple", ("float", "float", "Sum<float>"))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer((64,), mx.float32),
                            "reduction_size": 1000, "out_size": 64},
                   grid=(128, 16), threads_per_threadgroup=(128, 1))
    agreement("row_reduce_simple Sum<float32>", MLX, out.mx("out"), mx.sum(mx.array(x), -1),
              reference="mx.sum (CPU)", compile_s=built.compile_s, atol=1e-4, rtol=1e-5)


def test_row_reduce_looped(agreement) -> None:
    # Axes (0, 2) of a (8, 6, 300) array: rows of 300 with 8 non-row reductions (stride
    # 1800), one SIMD-group (row_size <= 512) per output.
    x = _ints((8, 6, 300))
    built = build(_library(), "row_reduce_looped", ("int", "int", "Sum<int>", "int", 1))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer((6,), mx.int32),
                            **_row_args(300, 8, [6], [300], [8], [1800])},
                   grid=(32, 6), threads_per_threadgroup=(32, 1))
    agreement("row_reduce_looped Sum<int32> (axes 0, 2)", MLX, out.mx("out"),
              mx.sum(mx.array(x), axis=(0, 2)), reference="mx.sum (CPU)",
              compile_s=built.compile_s, bitwise=True)


def _col_args(reduction_size: int, stride: int, reduce_shape: list[int],
              reduce_strides: list[int], non_col: int = 1) -> dict:
    """ColReduceArgs::encode for a contiguous input whose kept axes collapse away, after
    the reduced column was pushed onto reduce_shape / reduce_strides."""
    return {"reduction_size": reduction_size, "reduction_stride": stride, **NO_DIMS,
            "reduce_shape": np.array(reduce_shape, np.int32),
            "reduce_strides": np.array(reduce_strides, np.int64),
            "reduce_ndim": len(reduce_shape), "non_col_reductions": non_col}


def test_col_reduce_small(agreement) -> None:
    # Fewer than 32 rows in all: col_reduce_small, threadgroups of (ceil(16 / 4), 8).
    x = _floats((20, 16))
    built = build(_library(), "col_reduce_small", ("float", "float", "Min<float>", "int", 1))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer((16,), mx.float32),
                            **_col_args(20, 16, [20], [16])},
                   threadgroups=(1, 1, 1), threads_per_threadgroup=(4, 8, 1))
    agreement("col_reduce_small Min<float32>", MLX, out.mx("out"), mx.min(mx.array(x), 0),
              reference="mx.min (CPU)", compile_s=built.compile_s, bitwise=True)


def _second_pass(intermediate: np.ndarray, columns: int, blocks: int, dtype: mx.Dtype,
                 op: str, type_name: str) -> tuple[np.ndarray, float]:
    """The second pass of the two-pass column reductions: col_reduce_looped<U, U, Op,
    int, 1, 32, 32> over the `blocks` partial results of each column."""
    built = build(_library(), "col_reduce_looped", (type_name, type_name, op, "int", 1, 32, 32))
    out = run_both(built.kernel,
                   buffers={"in": intermediate, "out": new_buffer((columns,), dtype),
                            **_col_args(blocks, columns, [blocks], [columns]),
                            "column_offset": 0},
                   grid=(256 * -(-columns // 32), 1, 1), threads_per_threadgroup=(256, 1, 1))
    return out["out"], built.compile_s


def test_col_reduce_longcolumn(agreement) -> None:
    # Narrow (stride < 32) and long (>= 1024 rows): col_reduce_longcolumn over 32 outer
    # blocks into a (32, columns) intermediate, then the looped second pass.
    x = _ints((2048, 8))
    built = build(_library(), "col_reduce_longcolumn", ("int", "int", "Sum<int>", "int", 1))
    first = run_both(built.kernel,
                     buffers={"in": x, "out": new_buffer((32, 8), mx.int32),
                              **_col_args(2048, 8, [2048], [8]), "out_size": 8},
                     threadgroups=(1, 1, 32), threads_per_threadgroup=(8, 32, 1))
    result, _ = _second_pass(first["out"], 8, 32, mx.int32, "Sum<int>", "int")
    agreement("col_reduce_longcolumn Sum<int32> (two passes)", MLX, result,
              mx.sum(mx.array(x), 0), reference="mx.sum (CPU)", compile_s=built.compile_s,
              bitwise=True)


def test_col_reduce_looped(agreement) -> None:
    # 32 to 256 rows: col_reduce_looped with BM = BN = 32, 8 SIMD-groups a threadgroup,
    # one threadgroup per 32 columns.
    x = _floats((100, 64))
    built = build(_library(), "col_reduce_looped",
                  ("float", "float", "Max<float>", "int", 1, 32, 32))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer((64,), mx.float32),
                            **_col_args(100, 64, [100], [64]), "column_offset": 0},
                   grid=(512, 1, 1), threads_per_threadgroup=(256, 1, 1))
    agreement("col_reduce_looped Max<float32>", MLX, out.mx("out"), mx.max(mx.array(x), 0),
              reference="mx.max (CPU)", compile_s=built.compile_s, bitwise=True)


def test_col_reduce_2pass(agreement) -> None:
    # More than 256 rows and few outputs: col_reduce_2pass into 32 partial results per
    # column (grid y = 32 outer blocks), then the looped second pass.
    x = _floats((1000, 64))
    built = build(_library(), "col_reduce_2pass",
                  ("float", "float", "Sum<float>", "int", 1, 32, 32))
    first = run_both(built.kernel,
                     buffers={"in": x, "out": new_buffer((32, 64), mx.float32),
                              **_col_args(1000, 64, [1000], [64]), "column_offset": 0,
                              "out_size": 1},
                     grid=(512, 32, 1), threads_per_threadgroup=(256, 1, 1))
    result, _ = _second_pass(first["out"], 64, 32, mx.float32, "Sum<float>", "float")
    agreement("col_reduce_2pass Sum<float32> (two passes)", MLX, result,
              mx.sum(mx.array(x), 0), reference="mx.sum (CPU)", compile_s=built.compile_s,
              atol=1e-4, rtol=1e-5)
