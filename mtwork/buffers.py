"""Kernel memory as numpy arrays: new buffers (poisoned or filled), views of mx arrays.

A buffer nobody initialised starts as a poison pattern, so code that forgets to write an
element shows up: NaN with a recognisable payload for floats, 0xBE bytes otherwise.
bfloat16 data lives in numpy as its uint16 bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from . import dtypes

__all__ = ["allocate", "byte_span", "filled", "initialise", "numpy_view", "poisoned",
           "to_mx"]

_POISON_BITS = {
    mx.float32: np.uint32(0x7FC0BADD),
    mx.float16: np.uint16(0x7EBA),
    mx.bfloat16: np.uint16(0x7FBA),
    mx.complex64: np.uint32(0x7FC0BADD),
}


def initialise(out: np.ndarray, dtype: mx.Dtype, fill: float | None) -> np.ndarray:
    """Fills `out` (storage of `dtype`) with `fill` (converted as MLX converts it), or
    with the poison pattern when `fill` is None; returns it."""
    flat = out.reshape(-1)
    if fill is not None:
        one = mx.array(fill).astype(dtype)
        flat[...] = np.array(one.view(mx.uint16)) if dtype == mx.bfloat16 else np.array(one)
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


def to_mx(arr: np.ndarray | mx.array, dtype: mx.Dtype | None) -> mx.array:
    """A numpy buffer as an ``mx.array`` of `dtype` (uint16 bits become bfloat16)."""
    if isinstance(arr, mx.array):
        return arr
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
