"""Kernel memory as numpy arrays: new buffers (poisoned or filled), views of mx arrays.

A buffer nobody initialised starts as a poison pattern, so code that forgets to write an
element shows up: NaN with a recognisable payload for floats, 0xBE bytes otherwise.
bfloat16 data lives in numpy as its uint16 bits.

MLX keeps freed buffers for reuse up to a cache limit: on a Mac its Metal allocator's
limit is its memory limit; its CPU allocator's (mlx/backend/no_gpu/allocator.cpp) is
32 MiB, so there every larger array is new memory, faulted in page by page by its first
write (30 ms of a 64 MB output's copy, against 6 ms for the copy itself). `to_mx` raises
the CPU limit, while it is MLX's default or one set here, to hold a few arrays of the size
it makes (at most an eighth of MLX's memory limit; `reuse_memory_for`: the outputs
an operation of MLX's graph has MLX make, `mtwork.graph`), so that calls of a kernel in a loop
reuse the memory of the outputs they drop, as on a Mac. A limit the caller set with
``mx.set_cache_limit`` stays as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from . import dtypes
from .native import metal_available, original

__all__ = ["allocate", "byte_span", "fill_value", "filled", "initialise", "numpy_view",
           "poisoned", "reuse_memory_for", "to_mx"]

_POISON_BITS = {
    mx.float32: np.uint32(0x7FC0BADD),
    mx.float16: np.uint16(0x7EBA),
    mx.bfloat16: np.uint16(0x7FBA),
    mx.complex64: np.uint32(0x7FC0BADD),
}


def _saturated(value: float, low: int, high: int) -> int:
    """An AArch64 float-to-integer conversion: toward zero, saturating, NaN to 0."""
    if math.isnan(value):
        return 0
    return low if value <= low else high if value >= high else int(value)


def fill_value(fill: float, dtype: mx.Dtype) -> np.generic:
    """`fill` in `dtype`'s storage (bfloat16 as its bits) as MLX writes an ``init_value``:
    taken as a C++ float, then converted as on Apple silicon, where MLX's kernels run:
    floats round to nearest (±inf stays, NaN stays NaN: bfloat16's is 0x7FC0, MLX's);
    integers of 32 and 64 bits saturate, narrower ones take the low bits of the 32-bit
    saturated value (what clang emits for the narrowing), NaN gives 0; bool is
    ``fill != 0``, so NaN is true."""
    value = np.float32(fill)
    storage = np.dtype(dtypes.storage_numpy_dtype(dtype))
    if dtype == mx.bfloat16:
        if np.isnan(value):
            return np.uint16(0x7FC0)
        bits = int(value.view(np.uint32))
        return np.uint16(((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16) & 0xFFFF)
    if dtype == mx.bool_:
        return np.bool_(value != 0)
    if storage.kind in "fc":
        return storage.type(value)
    if storage.itemsize >= 4:
        limits = np.iinfo(storage)
        return storage.type(_saturated(float(value), int(limits.min), int(limits.max)))
    wide = _saturated(float(value), -(1 << 31), (1 << 31) - 1)
    unsigned = np.dtype(f"u{storage.itemsize}")
    return unsigned.type(wide & ((1 << (8 * storage.itemsize)) - 1)).view(storage)


def initialise(out: np.ndarray, dtype: mx.Dtype, fill: float | None) -> np.ndarray:
    """Fills `out` (storage of `dtype`) with `fill` (converted as MLX converts an
    ``init_value``, `fill_value`), or with the poison pattern when `fill` is None;
    returns it."""
    flat = out.reshape(-1)
    if fill is not None:
        flat[...] = fill_value(fill, dtype)
        return out
    pattern = _POISON_BITS.get(dtype)
    if pattern is None:
        flat.view(np.uint8).fill(0xBE)
    else:
        flat.view(pattern.dtype).fill(pattern)
    return out


def poisoned(dtype: mx.Dtype, shape: Sequence[int]) -> np.ndarray:
    """A new array of `dtype` holding the poison pattern."""
    return initialise(np.empty(tuple(shape), dtype=dtypes.storage_numpy_dtype(dtype)),
                      dtype, None)


def filled(dtype: mx.Dtype, shape: Sequence[int], value: float) -> np.ndarray:
    """A new array of `dtype` with every element `value` (converted as MLX converts it)."""
    return initialise(np.empty(tuple(shape), dtype=dtypes.storage_numpy_dtype(dtype)),
                      dtype, value)


def allocate(dtype: mx.Dtype, shape: Sequence[int], fill: float | None) -> np.ndarray:
    """`filled` with `fill`, or `poisoned` when `fill` is None."""
    return poisoned(dtype, shape) if fill is None else filled(dtype, shape, fill)


def numpy_view(arr: mx.array | np.ndarray) -> np.ndarray:
    """The array's memory as numpy, without a copy where possible; bfloat16 as uint16."""
    if isinstance(arr, np.ndarray):
        return arr
    if arr.dtype == mx.bfloat16:
        arr = arr.view(mx.uint16)
    return np.array(arr, copy=False)


_MLX_CPU_CACHE_LIMIT = 32 << 20  # MLX's default on the CPU
_REUSED_ARRAYS = 4  # arrays of one size the raised cache limit holds
_cache_limit: int | None = _MLX_CPU_CACHE_LIMIT  # None: the caller set one


def reuse_memory_for(nbytes: int) -> None:
    """Raises MLX's CPU cache limit to hold a few buffers of `nbytes` (module docstring)."""
    global _cache_limit
    if _cache_limit is None or nbytes <= _cache_limit // _REUSED_ARRAYS:
        return
    if metal_available():  # the Metal allocator caches up to its memory limit
        _cache_limit = None
        return
    wanted = min(_REUSED_ARRAYS * nbytes, original(mx.get_memory_limit)() // 8)
    if wanted <= _cache_limit:
        return
    set_cache_limit = original(mx.set_cache_limit)  # MLX's, not an interposed one
    previous = set_cache_limit(wanted)
    if previous != _cache_limit:  # the caller's own
        set_cache_limit(previous)
        _cache_limit = None
        return
    _cache_limit = wanted


def to_mx(arr: np.ndarray | mx.array, dtype: mx.Dtype | None) -> mx.array:
    """A numpy buffer as an ``mx.array`` of `dtype` (uint16 bits become bfloat16)."""
    if isinstance(arr, mx.array):
        return arr
    reuse_memory_for(arr.nbytes)
    out = mx.array(arr)
    return out.view(mx.bfloat16) if dtype == mx.bfloat16 else out


def byte_span(arr: np.ndarray) -> tuple[int, int]:
    """The addresses [lo, hi) of the bytes an array's elements reach (a strided or reversed
    view spans more, or other, memory than its data pointer and size say)."""
    start = arr.ctypes.data
    if arr.size == 0:
        return start, start
    low = sum((n - 1) * s for n, s in zip(arr.shape, arr.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(arr.shape, arr.strides) if s > 0)
    return start + low, start + high + arr.itemsize
