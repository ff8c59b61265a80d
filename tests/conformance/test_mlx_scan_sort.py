"""MLX's scans (scan.h), sorts (sort.h: block sort and the multi-block merge sort) and
logsumexp (logsumexp.h) on `sim`, against `mx.cumsum` / `mx.cummax` / `mx.logcumsumexp`,
`mx.sort` / `mx.argsort` and `mx.logsumexp` on the CPU.

Template arguments follow scan.metal (`contiguous_scan<T, U, Op<U>, N_READS, inclusive,
reverse>`), sort.metal (`block_sort<T, U, ARG_SORT, BN, TN>`, `mb_block_*<ValT, uint32_t,
true, 512, 4>`) and logsumexp.metal; arguments and geometry follow scan.cpp, sort.cpp
(`single_block_sort`, `multi_block_sort` with its partition and merge passes) and
logsumexp.cpp.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, ceil_div, metal_library, rng

SCAN = ("defines.h", "utils.h", "scan.h")


def _scan_library():
    return metal_library(*SCAN)


def _contiguous_threads(size: int, n_reads: int = 4) -> int:
    """scan.cpp: whole SIMD-groups of n_reads elements a thread, halved above n_reads *
    1024 elements, at most 1024."""
    per_simd = n_reads * 32
    if size <= n_reads * 1024:
        threads = -(-size // per_simd) * 32
    elif size <= n_reads * 2048:
        threads = -(-(size // 2) // per_simd) * 32
    else:
        threads = 1024
    return min(threads, 1024)


@pytest.mark.parametrize(("op", "dtype", "size", "inclusive", "reverse"), [
    ("CumSum", mx.int32, 1000, True, False),
    ("CumMax", mx.float32, 5000, False, True),
    ("CumLogaddexp", mx.float32, 700, True, False),
])
def test_contiguous_scan(agreement, op, dtype, size, inclusive, reverse) -> None:
    rows = 3
    g = rng()
    if dtype == mx.int32:
        x = mx.array(g.integers(-100, 100, (rows, size)), dtype)
    else:
        x = mx.array(g.standard_normal((rows, size)), dtype)
    type_name = "int" if dtype == mx.int32 else "float"
    built = build(_scan_library(), "contiguous_scan",
                  (type_name, type_name, f"{op}<{type_name}>", 4, inclusive, reverse))
    threads = _contiguous_threads(size)
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer(x.shape, dtype),
                                          "axis_size": size},
                   grid=(threads, rows, 1), threads_per_threadgroup=(threads, 1, 1))
    fn, kwargs = {"CumSum": (mx.cumsum, {}), "CumMax": (mx.cummax, {}),
                  "CumLogaddexp": (mx.logcumsumexp, {})}[op]
    expected = fn(x, axis=-1, reverse=reverse, inclusive=inclusive, **kwargs)
    label = ("inclusive" if inclusive else "exclusive") + (", reverse" if reverse else "")
    # Sums of integers and running maxima are exact; log-add-exp rounds at every step.
    exact = op != "CumLogaddexp"
    agreement(f"contiguous_scan {op}<{type_name}> ({label})", MLX, out.mx("out"), expected,
              reference=f"mx.{fn.__name__} (CPU)", compile_s=built.compile_s,
              bitwise=exact, **({} if exact else {"atol": 1e-5, "rtol": 1e-5}))


def test_strided_scan(agreement) -> None:
    # A scan along axis 0 of a (300, 40) array: strided_scan, stride 40 in blocks of 32
    # columns (stride_blocks = 2), 8 SIMD-groups a threadgroup, one per block.
    x = mx.array(rng().standard_normal((300, 40)), mx.float32)
    built = build(_scan_library(), "strided_scan",
                  ("float", "float", "CumSum<float>", 4, True, False))
    out = run_both(built.kernel,
                   buffers={"in": x, "out": new_buffer(x.shape, mx.float32), "axis_size": 300,
                            "stride": 40, "stride_blocks": 2},
                   grid=(256, 2, 1), threads_per_threadgroup=(256, 1, 1))
    agreement("strided_scan CumSum<float> (axis 0)", MLX, out.mx("out"), mx.cumsum(x, axis=0),
              reference="mx.cumsum (CPU)", compile_s=built.compile_s, atol=1e-4, rtol=1e-5)


SORT = ("utils.h", "sort.h")


def _block_threads(size: int) -> int:
    """sort.cpp's bn: the smallest power of two from 32 to 512 with 4 elements a thread."""
    needed = -(-size // 4)
    return next(bn for bn in (32, 64, 128, 256, 512) if needed <= bn or bn == 512)


@pytest.mark.parametrize(("argsort", "dtype"), [(False, mx.float32), (True, mx.int32),
                                                (False, mx.float16)])
def test_block_sort(agreement, argsort, dtype) -> None:
    # One block a row (size <= bn * 4): block_sort over contiguous rows; strides of the
    # sorted axis 1 and of the segment axis `size`.
    rows, size = 4, 300
    g = rng()
    if dtype == mx.int32:
        x = mx.array(g.permuted(np.tile(np.arange(size), (rows, 1)), axis=1), dtype)
    else:
        x = mx.array(g.standard_normal((rows, size)), dtype)
    bn = _block_threads(size)
    out_dtype = mx.uint32 if argsort else dtype
    built = build(metal_library(*SORT), "block_sort", (dtype, out_dtype, argsort, bn, 4))
    out = run_both(built.kernel,
                   buffers={"inp": x, "out": new_buffer(x.shape, out_dtype),
                            "size_sorted_axis": size, "in_stride_sorted_axis": 1,
                            "out_stride_sorted_axis": 1, "in_stride_segment_axis": size,
                            "out_stride_segment_axis": size},
                   threadgroups=(1, rows, 1), threads_per_threadgroup=(bn, 1, 1))
    # Distinct keys (a permutation) make the argsort unique; values sort to the same bits.
    expected = mx.argsort(x, axis=-1).astype(mx.uint32) if argsort else mx.sort(x, axis=-1)
    what = "argsort" if argsort else "sort"
    agreement(f"block_sort {what}<{dtype}> bn={bn}".replace("mlx.core.", ""), MLX,
              out.mx("out"), expected, reference=f"mx.{what} (CPU)",
              compile_s=built.compile_s, bitwise=True)


def test_multi_block_merge_sort(agreement) -> None:
    # Rows longer than 512 * 4: mb_block_sort sorts blocks of 2048 into values and
    # indices, then for merge_tiles = 2, 4, ... mb_block_partition finds the split points
    # (n_blocks + 1 threads) and mb_block_merge merges pairs of sorted runs, ping-pong.
    rows, size, bn, tn = 2, 7000, 512, 4
    n_blocks = -(-size // (bn * tn))
    x = mx.array(rng().permuted(np.tile(np.arange(size), (rows, 1)), axis=1), mx.float32)
    lib = metal_library(*SORT)
    template = (mx.float32, "uint32_t", True, bn, tn)
    sort = build(lib, "mb_block_sort", template)
    partition = build(lib, "mb_block_partition", template)
    merge = build(lib, "mb_block_merge", template)
    values = [new_buffer((rows, size), mx.float32), np.zeros((rows, size), np.float32)]
    indices = [new_buffer((rows, size), mx.uint32), np.zeros((rows, size), np.uint32)]
    first = run_both(sort.kernel,
                     buffers={"inp": x, "out_vals": values[0], "out_idxs": indices[0],
                              "size_sorted_axis": size, "stride_sorted_axis": 1, "nc_dim": 1,
                              "nc_shape": np.array([rows], np.int32),
                              "nc_strides": np.array([size], np.int64)},
                     threadgroups=(n_blocks, rows, 1), threads_per_threadgroup=(bn, 1, 1))
    values[0], indices[0] = first["out_vals"], first["out_idxs"]
    partitions = np.zeros((rows, n_blocks + 1), np.uint32)
    merge_tiles, ping = 2, 0
    while merge_tiles // 2 < n_blocks:
        src, dst = ping, 1 - ping
        partitions = run_both(partition.kernel,
                              buffers={"block_partitions": partitions, "dev_vals": values[src],
                                       "dev_idxs": indices[src], "size_sorted_axis": size,
                                       "merge_tiles": merge_tiles, "n_blocks": n_blocks},
                              threadgroups=(1, rows, 1),
                              threads_per_threadgroup=(min(n_blocks + 1, 1024), 1, 1),
                              )["block_partitions"]
        merged = run_both(merge.kernel,
                          buffers={"block_partitions": partitions, "dev_vals_in": values[src],
                                   "dev_idxs_in": indices[src], "dev_vals_out": values[dst],
                                   "dev_idxs_out": indices[dst], "size_sorted_axis": size,
                                   "merge_tiles": merge_tiles, "num_tiles": n_blocks},
                          threadgroups=(n_blocks, rows, 1), threads_per_threadgroup=(bn, 1, 1))
        values[dst], indices[dst] = merged["dev_vals_out"], merged["dev_idxs_out"]
        merge_tiles, ping = merge_tiles * 2, dst
    agreement("mb_block_sort + partition + merge: values", MLX, values[ping], mx.sort(x, -1),
              reference="mx.sort (CPU)", compile_s=sort.compile_s + merge.compile_s,
              bitwise=True)
    agreement("mb_block_sort + partition + merge: indices", MLX, indices[ping],
              mx.argsort(x, -1).astype(mx.uint32), reference="mx.argsort (CPU)",
              compile_s=partition.compile_s, bitwise=True)


@pytest.mark.parametrize(("function", "axis"), [("logsumexp", 1000), ("logsumexp_looped", 6000)])
def test_logsumexp(agreement, function, axis) -> None:
    # logsumexp.cpp: rows up to 4096 take `logsumexp` with whole SIMD-groups of 4
    # elements a thread; longer rows `logsumexp_looped` with 1024 threads.
    rows = 3
    x = mx.array(rng().standard_normal((rows, axis)) * 3, mx.float32)
    built = build(metal_library("utils.h", "logsumexp.h"), function, (mx.float32,))
    threads = 1024 if function == "logsumexp_looped" else ceil_div(ceil_div(axis, 4), 32) * 32
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer((rows,), mx.float32),
                                          "axis_size": axis},
                   grid=(rows * threads,), threads_per_threadgroup=(threads,))
    agreement(f"{function}<float32> (axis {axis})", MLX, out.mx("out"),
              mx.logsumexp(x, axis=-1), reference="mx.logsumexp (CPU)",
              compile_s=built.compile_s, atol=1e-5, rtol=1e-5)
