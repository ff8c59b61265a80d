"""The self-test's kernels written for it: each runs on any backend and has an oracle
written from the algorithm, and together they touch what differs most between machines
and backends: elementwise math, half and bfloat arithmetic, threadgroup memory and
barriers, SIMD-group functions, `simdgroup_matrix`, atomics.

A `Case` says whether its backends must agree bit for bit (`exact`: the operation is
exactly defined, such as integer-valued sums or one correctly rounded operation) or within
`mtwork.diff`'s bands (Metal's own `exp` is not the emulator's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import mlx.core as mx
import numpy as np

from ..kernel import MetalKernel, metal_kernel

__all__ = ["Case", "builtin_cases"]


@dataclass(frozen=True)
class Case:
    """One kernel of the self-test: `run(backend)` dispatches it there and returns its
    outputs; `expected()` gives the oracle's. `exact`: backends and oracle agree bit for
    bit; else within `mtwork.diff`'s bands (`diff_options` override them). `covers` says
    what the kernel exercises."""

    name: str
    covers: str
    run: Callable[[str], Sequence[Any]]
    expected: Callable[[], Sequence[Any]]
    exact: bool = False
    diff_options: Mapping[str, Any] = field(default_factory=dict)


def _rng(seed: int = 27) -> np.random.Generator:
    return np.random.default_rng(seed)


def _integers(n: int, low: int = -64, high: int = 64, seed: int = 27) -> np.ndarray:
    """Integer-valued floats: sums of a few of them are exact in float32, whatever the
    order of the additions."""
    return _rng(seed).integers(low, high, n).astype(np.float32)


# --- elementwise ------------------------------------------------------------------------------

_N = 4096


@cache
def _exp() -> MetalKernel:
    return metal_kernel("selftest_exp", ["inp"], ["out"],
                        "uint i = thread_position_in_grid.x;\nout[i] = metal::exp(inp[i]);")


def _exp_input() -> np.ndarray:
    return (_rng().standard_normal(_N) * 4).astype(np.float32)


def _run_exp(backend: str) -> list[mx.array]:
    return _exp()(inputs=[mx.array(_exp_input())], grid=(_N, 1, 1), threadgroup=(256, 1, 1),
                  output_shapes=[(_N,)], output_dtypes=[mx.float32], backend=backend)


# --- half and bfloat: one correctly rounded operation each ------------------------------------

_HALF_SOURCE = """
uint i = thread_position_in_grid.x;
half x = a[i], y = b[i];
sum[i] = x + y;
product[i] = x * y;
converted[i] = half(float(x) * 0.1f);
"""


@cache
def _half() -> MetalKernel:
    return metal_kernel("selftest_half", ["a", "b"], ["sum", "product", "converted"],
                        _HALF_SOURCE)


def _half_inputs() -> list[np.ndarray]:
    g = _rng(5)
    a = g.standard_normal(_N) * np.exp2(g.integers(-20, 8, _N))  # subnormal halves too
    b = g.standard_normal(_N) * np.exp2(g.integers(-6, 6, _N))
    return [a.astype(np.float16), b.astype(np.float16)]


def _run_half(backend: str) -> list[mx.array]:
    a, b = _half_inputs()
    return _half()(inputs=[mx.array(a), mx.array(b)], grid=(_N, 1, 1),
                   threadgroup=(128, 1, 1), output_shapes=[(_N,)] * 3,
                   output_dtypes=[mx.float16] * 3, backend=backend)


def _half_expected() -> list[np.ndarray]:
    # numpy's float16 operations round float32 results once more: for one addition or
    # multiplication of halves that is the correctly rounded result (float32 has more
    # than twice half's 11 bits, and two more).
    a, b = _half_inputs()
    converted = (a.astype(np.float32) * np.float32(0.1)).astype(np.float16)
    return [a + b, a * b, converted]


@cache
def _bfloat() -> MetalKernel:
    return metal_kernel("selftest_bfloat", ["a", "b"], ["sum", "product"], """
uint i = thread_position_in_grid.x;
sum[i] = a[i] + b[i];
product[i] = a[i] * b[i];
""")


def _bfloat_inputs() -> list[mx.array]:
    g = _rng(6)
    a = g.standard_normal(_N) * np.exp2(g.integers(-130, 20, _N))  # subnormal bfloats too
    b = g.standard_normal(_N) * np.exp2(g.integers(-4, 4, _N))
    return [mx.array(a.astype(np.float32)).astype(mx.bfloat16),
            mx.array(b.astype(np.float32)).astype(mx.bfloat16)]


def _run_bfloat(backend: str) -> list[mx.array]:
    return _bfloat()(inputs=_bfloat_inputs(), grid=(_N, 1, 1), threadgroup=(128, 1, 1),
                     output_shapes=[(_N,)] * 2, output_dtypes=[mx.bfloat16] * 2,
                     backend=backend)


def _bfloat_expected() -> list[mx.array]:
    a, b = _bfloat_inputs()  # MLX's CPU operations: in float, rounded once to bfloat
    return [mx.add(a, b, stream=mx.cpu), mx.multiply(a, b, stream=mx.cpu)]


# --- threadgroup memory and barriers ------------------------------------------------------------

_TREE_SOURCE = """
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


@cache
def _tree() -> MetalKernel:
    return metal_kernel("selftest_tree_sum", ["inp"], ["out"], _TREE_SOURCE)


def _run_tree(backend: str) -> list[mx.array]:
    return _tree()(inputs=[mx.array(_integers(_N))], grid=(_N, 1, 1), threadgroup=(256, 1, 1),
                   output_shapes=[(_N // 256,)], output_dtypes=[mx.float32], backend=backend)


_TRANSPOSE_SOURCE = """
threadgroup float tile[32][33];
uint2 g = threadgroup_position_in_grid.xy, l = thread_position_in_threadgroup.xy;
for (uint r = l.y; r < 32; r += 8) tile[r][l.x] = inp[(g.y * 32 + r) * W + g.x * 32 + l.x];
threadgroup_barrier(mem_flags::mem_threadgroup);
for (uint r = l.y; r < 32; r += 8) out[(g.x * 32 + r) * H + g.y * 32 + l.x] = tile[l.x][r];
"""
_H, _W = 64, 96


@cache
def _transpose() -> MetalKernel:
    return metal_kernel("selftest_transpose", ["inp"], ["out"], _TRANSPOSE_SOURCE)


def _run_transpose(backend: str) -> list[mx.array]:
    x = _rng(3).standard_normal((_H, _W)).astype(np.float32)
    return _transpose()(inputs=[mx.array(x)], grid=(_W, _H // 4, 1), threadgroup=(32, 8, 1),
                        template=[("W", _W), ("H", _H)], output_shapes=[(_W, _H)],
                        output_dtypes=[mx.float32], backend=backend)


# --- SIMD-groups --------------------------------------------------------------------------------

_SIMD_SOURCE = """
uint i = thread_position_in_grid.x;
float x = inp[i];
sums[i] = simd_sum(x);
prefix[i] = simd_prefix_exclusive_sum(x);
shuffled[i] = simd_shuffle_xor(x, 5);
maxima[i] = simd_max(x);
"""
_SIMD_N = 256


@cache
def _simd() -> MetalKernel:
    return metal_kernel("selftest_simd", ["inp"], ["sums", "prefix", "shuffled", "maxima"],
                        _SIMD_SOURCE)


def _run_simd(backend: str) -> list[mx.array]:
    return _simd()(inputs=[mx.array(_integers(_SIMD_N))], grid=(_SIMD_N, 1, 1),
                   threadgroup=(64, 1, 1), output_shapes=[(_SIMD_N,)] * 4,
                   output_dtypes=[mx.float32] * 4, backend=backend)


def _simd_expected() -> list[np.ndarray]:
    x = _integers(_SIMD_N).reshape(-1, 32)  # 32 lanes a SIMD-group
    sums = np.repeat(x.sum(axis=1, keepdims=True), 32, axis=1)
    prefix = np.cumsum(x, axis=1) - x
    shuffled = x[:, np.arange(32) ^ 5]
    maxima = np.repeat(x.max(axis=1, keepdims=True), 32, axis=1)
    return [a.reshape(-1) for a in (sums, prefix, shuffled, maxima)]


_MATRIX_SOURCE = """
uint sg = simdgroup_index_in_threadgroup;
uint row = (sg / 2) * 8, col = (sg % 2) * 8;
simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
simdgroup_float8x8 ma, mb;
for (uint k = 0; k < 32; k += 8) {
    simdgroup_load(ma, a + row * 32 + k, 32);
    simdgroup_load(mb, b + k * 16 + col, 16);
    simdgroup_multiply_accumulate(acc, ma, mb, acc);
}
simdgroup_store(acc, c + row * 16 + col, 16);
"""


@cache
def _matrix() -> MetalKernel:
    return metal_kernel("selftest_simdgroup_matrix", ["a", "b"], ["c"], _MATRIX_SOURCE)


def _matrix_inputs() -> list[np.ndarray]:
    return [_integers(16 * 32, -8, 8, seed=1).reshape(16, 32),
            _integers(32 * 16, -8, 8, seed=2).reshape(32, 16)]


def _run_matrix(backend: str) -> list[mx.array]:
    a, b = _matrix_inputs()
    return _matrix()(inputs=[mx.array(a), mx.array(b)], grid=(128, 1, 1),
                     threadgroup=(128, 1, 1), output_shapes=[(16, 16)],
                     output_dtypes=[mx.float32], backend=backend)


# --- atomics ------------------------------------------------------------------------------------

_HISTOGRAM_SOURCE = """
threadgroup atomic_uint local[16];
uint t = thread_position_in_threadgroup.x;
if (t < 16) atomic_store_explicit(&local[t], 0u, memory_order_relaxed);
threadgroup_barrier(mem_flags::mem_threadgroup);
atomic_fetch_add_explicit(&local[values[thread_position_in_grid.x] % 16], 1u,
                          memory_order_relaxed);
threadgroup_barrier(mem_flags::mem_threadgroup);
if (t < 16) {
    uint n = atomic_load_explicit(&local[t], memory_order_relaxed);
    atomic_fetch_add_explicit(&hist[t], n, memory_order_relaxed);
}
"""


@cache
def _histogram() -> MetalKernel:
    return metal_kernel("selftest_histogram", ["values"], ["hist"], _HISTOGRAM_SOURCE,
                        atomic_outputs=True)


def _histogram_input() -> np.ndarray:
    return _rng(9).integers(0, 1000, _N).astype(np.uint32)


def _run_histogram(backend: str) -> list[mx.array]:
    return _histogram()(inputs=[mx.array(_histogram_input())], grid=(_N, 1, 1),
                        threadgroup=(256, 1, 1), output_shapes=[(16,)],
                        output_dtypes=[mx.uint32], init_value=0, backend=backend)


def builtin_cases() -> list[Case]:
    """The kernels written for the self-test."""
    return [
        Case("exp", "elementwise math (float32, Metal's exp)", _run_exp,
             lambda: [np.exp(_exp_input().astype(np.float64))]),
        Case("half arithmetic", "half addition, multiplication, conversion (subnormals too)",
             _run_half, _half_expected, exact=True),
        Case("bfloat arithmetic", "bfloat addition and multiplication (subnormals too)",
             _run_bfloat, _bfloat_expected, exact=True),
        Case("tree sum", "threadgroup memory, threadgroup_barrier", _run_tree,
             lambda: [_integers(_N).reshape(-1, 256).astype(np.float64).sum(axis=1)],
             exact=True),
        Case("transpose", "a threadgroup tile read across the barrier", _run_transpose,
             lambda: [_rng(3).standard_normal((_H, _W)).astype(np.float32).T],
             exact=True),
        Case("SIMD-group functions", "simd_sum, simd_prefix_exclusive_sum, "
             "simd_shuffle_xor, simd_max", _run_simd, _simd_expected, exact=True),
        Case("simdgroup_matrix", "simdgroup_load, multiply_accumulate, store", _run_matrix,
             lambda: [np.matmul(*(m.astype(np.float64) for m in _matrix_inputs()))],
             exact=True),
        Case("atomics", "threadgroup and device atomic_uint", _run_histogram,
             lambda: [np.bincount(_histogram_input() % 16, minlength=16).astype(np.uint32)],
             exact=True),
    ]
