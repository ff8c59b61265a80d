"""Python values as the memory of a full-source kernel's parameters.

A pointer parameter takes a numpy array (written in place when the kernel may write it),
an ``mx.array`` (copied: arrays are values) or `new_buffer(...)`; a ``constant T&``
scalar or vector takes a Python number, a sequence of lane values or an array of the
declared type; a struct takes its bytes. Every value is checked against the declared
type, with a message naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from . import dtypes
from .dispatch import Bound, Fresh
from .msl.signature import KernelParam
from .msl.types import METAL_TYPE_NAMES, TypeInfo

__all__ = ["NewBuffer", "bind", "check_array_dtype", "fresh", "new_buffer", "python_number",
           "raw_bytes", "scalar_bytes", "type_name"]


@dataclass(frozen=True)
class NewBuffer:
    """A buffer the dispatch makes: `shape` elements of `dtype` (default: the declared
    element type), filled with `fill`, or on sim with a poison pattern (NaN for floats,
    0xBE bytes otherwise) so that elements the kernel forgets to write show up."""

    shape: tuple[int, ...]
    dtype: Any = None
    fill: float | int | None = None


def new_buffer(shape: int | Sequence[int], dtype: Any = None, *,
               fill: float | int | None = None) -> NewBuffer:
    """Asks a dispatch for a new buffer; it comes back in the dispatch's `Outputs`."""
    return NewBuffer(_dims(shape), dtype, _fill(fill))


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _dims(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if _integer(shape) else shape
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not all(
            _integer(d) for d in dims):
        raise TypeError(f"new_buffer: `shape` must be an integer or a sequence of integers, "
                        f"got {type(shape).__name__} {shape!r}")
    if any(d < 0 for d in dims):
        raise ValueError(f"new_buffer: `shape` {shape!r} has a negative size; sizes are 0 "
                         f"or more")
    return tuple(int(d) for d in dims)


def _fill(fill: Any) -> float | int | None:
    if fill is None:
        return None
    if isinstance(fill, (bool, np.bool_)) or not isinstance(
            fill, (int, float, np.integer, np.floating)):
        raise ValueError(f"new_buffer: `fill` must be a number (inf and nan too) or None, "
                         f"got {type(fill).__name__} {fill!r}")
    return fill


def python_number(value: Any, info: TypeInfo, what: str) -> Any:
    """Checks a Python number against the declared scalar type and returns it."""
    kind = np.dtype(dtypes.storage_numpy_dtype(info.dtype)).kind
    if info.dtype == mx.bfloat16:
        kind = "f"
    if isinstance(value, (bool, np.bool_)):
        if info.dtype != mx.bool_:
            raise TypeError(f"{what} takes a {type_name(info)}, not the bool {value!r}")
        return bool(value)
    if info.dtype == mx.bool_:
        raise TypeError(f"{what} takes a bool, not {type(value).__name__} {value!r}")
    if isinstance(value, (int, np.integer)):
        if kind in "iu":
            limits = np.iinfo(dtypes.storage_numpy_dtype(info.dtype))
            if not limits.min <= int(value) <= limits.max:
                raise ValueError(f"{what}: {value} is outside the range of {type_name(info)} "
                                 f"[{limits.min}, {limits.max}]")
        return int(value)
    if isinstance(value, (float, np.floating)):
        if kind in "iu":
            raise TypeError(f"{what} takes an integer ({type_name(info)}), not the float {value!r}")
        return float(value)
    if isinstance(value, complex) and kind == "c":
        return value
    raise TypeError(f"{what} takes a {type_name(info)}, not {type(value).__name__} {value!r}")


def type_name(info: TypeInfo) -> str:
    base = METAL_TYPE_NAMES.get(info.dtype, str(info.dtype))
    return base + (str(info.lanes) if info.lanes > 1 else "")


def scalar_bytes(value: Any, info: TypeInfo, what: str) -> np.ndarray:
    """A scalar or vector value as the declared type's bytes (storage dtype, padded)."""
    storage = dtypes.storage_numpy_dtype(info.dtype)
    if isinstance(value, mx.array):
        if value.dtype != info.dtype or value.size != info.lanes:
            raise TypeError(f"{what} takes a {type_name(info)}, got an mx.array of "
                            f"{value.size} {value.dtype}")
        flat = np.array(value.view(mx.uint16) if value.dtype == mx.bfloat16 else value).ravel()
    elif isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype.kind != "O":
        arr = np.asarray(value)
        if arr.dtype != storage or arr.size != info.lanes:
            raise TypeError(f"{what} takes a {type_name(info)}, got a numpy {arr.dtype} value of "
                            f"{arr.size} element(s)")
        flat = arr.ravel()
    else:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if len(items) != info.lanes:
            raise TypeError(f"{what} takes {info.lanes} value(s), got {len(items)}")
        numbers = [python_number(v, info, what) for v in items]
        if info.dtype == mx.bfloat16:
            flat = np.array(mx.array(numbers, dtype=mx.bfloat16).view(mx.uint16))
        else:
            flat = np.array(numbers, dtype=storage)
    out = np.zeros(info.storage_lanes, dtype=storage)
    out[: info.lanes] = flat
    return out


def raw_bytes(value: Any, what: str) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(value), dtype=np.uint8).copy()
    if isinstance(value, (np.ndarray, np.generic)):
        return np.ascontiguousarray(value)
    raise TypeError(f"{what} is a struct: pass its bytes (a numpy array, e.g. with a "
                    f"structured dtype matching its layout, or bytes), not "
                    f"{type(value).__name__}")


def check_array_dtype(arr: np.ndarray | mx.array, info: TypeInfo | None, what: str) -> None:
    if info is None:
        return
    if isinstance(arr, mx.array):
        ok = arr.dtype == info.dtype
    else:
        ok = arr.dtype == dtypes.storage_numpy_dtype(info.dtype)
    # complex64 is laid out as float2 (real, imaginary): MLX binds its complex arrays to
    # float2 parameters (fft.h).
    ok = ok or (info.dtype == mx.float32 and info.lanes == 2 and arr.dtype in
                (mx.complex64, np.complex64))
    if not ok:
        raise TypeError(f"{what} points at {type_name(info)} data; got an array of {arr.dtype} "
                        f"(convert it, or view its bytes as the declared type)")


def fresh(request: NewBuffer, info: TypeInfo | None, what: str) -> Fresh:
    """The buffer `request` asks for: its dtype defaults to the declared element type (a
    vector element adds a trailing axis of its lanes in memory)."""
    if request.dtype is None:
        if info is None:
            raise TypeError(f"{what}: give new_buffer a dtype (the element type is a struct)")
        dtype = info.dtype
    elif isinstance(request.dtype, mx.Dtype):
        dtype = request.dtype
    else:
        dtype = dtypes.mx_dtype_from_numpy(request.dtype)
    shape = tuple(request.shape)
    if info is not None and info.storage_lanes > 1 and request.dtype is None:
        shape = (*shape, info.storage_lanes)
    return Fresh(shape, dtype, request.fill)


def bind(p: KernelParam, value: Any, info: TypeInfo | None, what: str, *,
         keep_arrays: bool = False) -> Bound | Fresh:
    """The memory `value` gives buffer parameter `p` (`info`: what it points at).
    `keep_arrays`: an ``mx.array`` is bound as it is (an input of an operation of MLX's
    graph, read when MLX evaluates it), not copied now."""
    if not p.is_pointer:
        if info is None:
            return Bound(raw_bytes(value, what))
        return Bound(scalar_bytes(value, info, what), info.dtype)
    if isinstance(value, NewBuffer):
        return fresh(value, info, what)
    if isinstance(value, mx.array):
        check_array_dtype(value, info, what)
        if keep_arrays:
            return Bound(value, value.dtype, writable=p.writable)
        view = value.view(mx.uint16) if value.dtype == mx.bfloat16 else value
        # A copy: mx arrays are values; a writable buffer's result comes back in Outputs.
        return Bound(np.array(view, copy=True, order="C"), value.dtype, writable=p.writable)
    if isinstance(value, np.ndarray):
        check_array_dtype(value, info, what)
        if p.writable and not (value.flags.c_contiguous and value.flags.writeable):
            raise ValueError(f"{what} is written by the kernel: pass a writable, "
                             f"C-contiguous numpy array (np.ascontiguousarray(...))")
        arr = value if p.writable else np.ascontiguousarray(value)
        return Bound(arr, info.dtype if info else None, writable=p.writable)
    raise TypeError(f"{what} is a pointer: pass an array (numpy or mx) or "
                    f"mtwork.new_buffer(...), not {type(value).__name__} {value!r}")
