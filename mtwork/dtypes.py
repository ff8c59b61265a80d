"""Dtype facts for kernel inputs and outputs.

The Metal type names are those of MLX's ``get_type_string``
(``mlx/backend/common/compiled.cpp``), and the conversion of Python scalars follows
MLX's Python ``to_array`` (``python/src/utils.cpp``), as of MLX 0.32. Both decide the
text of a generated kernel, so they must match MLX exactly.
"""

from __future__ import annotations

import copyreg
from typing import Any

import mlx.core as mx
import numpy as np

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "as_mx_array",
    "itemsize",
    "mx_dtype_from_numpy",
    "storage_numpy_dtype",
    "type_string",
]


def _dtype_by_name(name: str) -> mx.Dtype:
    return mx.bool_ if name == "bool" else getattr(mx, name)


def _reduce_dtype(dtype: mx.Dtype) -> tuple[Any, tuple[str]]:
    return _dtype_by_name, (str(dtype).rsplit(".", 1)[-1],)


# Kernel descriptions (which name dtypes) travel to the emulator's worker process.
copyreg.pickle(mx.Dtype, _reduce_dtype)

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# Metal spelling of each MLX dtype, as it appears in signatures and kernel names.
_TYPE_STRINGS: dict[mx.Dtype, str] = {
    mx.bool_: "bool",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.float32: "float",
    mx.float64: "double",
    mx.complex64: "complex64_t",
}

# numpy dtype holding the same bytes; numpy has no bfloat16, so its raw bits are uint16.
_STORAGE: dict[mx.Dtype, np.dtype] = {
    mx.bool_: np.dtype(np.bool_),
    mx.uint8: np.dtype(np.uint8),
    mx.uint16: np.dtype(np.uint16),
    mx.uint32: np.dtype(np.uint32),
    mx.uint64: np.dtype(np.uint64),
    mx.int8: np.dtype(np.int8),
    mx.int16: np.dtype(np.int16),
    mx.int32: np.dtype(np.int32),
    mx.int64: np.dtype(np.int64),
    mx.float16: np.dtype(np.float16),
    mx.bfloat16: np.dtype(np.uint16),
    mx.float32: np.dtype(np.float32),
    mx.float64: np.dtype(np.float64),
    mx.complex64: np.dtype(np.complex64),
}

# What `mx.array(numpy_array)` produces: float64 and complex128 are narrowed.
_FROM_NUMPY: dict[np.dtype, mx.Dtype] = {
    np.dtype(np.bool_): mx.bool_,
    np.dtype(np.uint8): mx.uint8,
    np.dtype(np.uint16): mx.uint16,
    np.dtype(np.uint32): mx.uint32,
    np.dtype(np.uint64): mx.uint64,
    np.dtype(np.int8): mx.int8,
    np.dtype(np.int16): mx.int16,
    np.dtype(np.int32): mx.int32,
    np.dtype(np.int64): mx.int64,
    np.dtype(np.float16): mx.float16,
    np.dtype(np.float32): mx.float32,
    np.dtype(np.float64): mx.float32,
    np.dtype(np.complex64): mx.complex64,
    np.dtype(np.complex128): mx.complex64,
}


def _check_dtype(dtype: Any) -> mx.Dtype:
    if not isinstance(dtype, mx.Dtype) or dtype not in _TYPE_STRINGS:
        raise ValueError(f"Unsupported dtype {dtype!r}: expected one of {_known_dtypes()}.")
    return dtype


def _known_dtypes() -> str:
    return ", ".join(str(d) for d in _TYPE_STRINGS)


def type_string(dtype: mx.Dtype) -> str:
    """Metal type name MLX writes for ``dtype`` (e.g. ``float16`` -> ``"float16_t"``)."""
    return _TYPE_STRINGS[_check_dtype(dtype)]


def storage_numpy_dtype(dtype: mx.Dtype) -> np.dtype:
    """numpy dtype with the same item size and bytes (``bfloat16`` -> ``uint16``)."""
    return _STORAGE[_check_dtype(dtype)]


def itemsize(dtype: mx.Dtype) -> int:
    """Bytes per element of ``dtype``."""
    return _check_dtype(dtype).size


def mx_dtype_from_numpy(np_dtype: Any) -> mx.Dtype:
    """MLX dtype that ``mx.array`` gives a numpy array of ``np_dtype``.

    Like MLX, float64 becomes float32 and complex128 becomes complex64; dtypes that
    ``mx.array`` refuses (including non-native byte order) raise ValueError.
    """
    try:
        key = np.dtype(np_dtype)
    except TypeError as exc:
        raise ValueError(f"Not a numpy dtype: {np_dtype!r}.") from exc
    # Non-native byte order does not match any key: mx.array refuses such arrays too.
    try:
        return _FROM_NUMPY[key]
    except KeyError:
        raise ValueError(
            f"numpy dtype {key} has no MLX equivalent; supported: "
            + ", ".join(str(d) for d in _FROM_NUMPY)
            + "."
        ) from None


def _scalar_int(value: int) -> mx.array:
    # MLX keeps int32 for values that fit and widens to int64 otherwise.
    if INT32_MIN <= value <= INT32_MAX:
        return mx.array(value, dtype=mx.int32)
    if _INT64_MIN <= value <= _INT64_MAX:
        return mx.array(value, dtype=mx.int64)
    raise ValueError(f"Python int {value} does not fit in int64, so it cannot be a kernel input.")


_ACCEPTED = (
    "accepted: mlx.core.array, numpy.ndarray or numpy scalar, an object with __mlx_array__, "
    "or a Python bool, int, float or complex"
)


def as_mx_array(x: Any) -> mx.array:
    """Convert one kernel input the way ``mx.fast.metal_kernel`` does.

    Python scalars become 0-d arrays: ``bool`` -> bool_, ``int`` -> int32 (int64 when
    outside the int32 range), ``float`` -> float32, ``complex`` -> complex64. numpy
    values go through ``mx.array``; MLX arrays are returned unchanged.
    """
    if isinstance(x, mx.array):
        return x
    # bool before int: bool is a subclass of int but keeps its own dtype.
    if isinstance(x, bool):
        return mx.array(x, dtype=mx.bool_)
    if isinstance(x, int):
        return _scalar_int(x)
    if isinstance(x, float):
        return mx.array(x, dtype=mx.float32)
    if isinstance(x, complex):
        return mx.array(x, dtype=mx.complex64)
    if isinstance(x, (np.ndarray, np.generic)):
        try:
            mx_dtype_from_numpy(x.dtype)
        except ValueError as exc:
            raise TypeError(f"Cannot use a numpy value of dtype {x.dtype} as a kernel input; "
                            f"{_ACCEPTED}.") from exc
        return mx.array(x)
    if hasattr(x, "__mlx_array__"):
        arr = x.__mlx_array__()
        if not isinstance(arr, mx.array):
            raise TypeError(
                f"{type(x).__name__}.__mlx_array__() returned {type(arr).__name__}, "
                "not mlx.core.array."
            )
        return arr
    raise TypeError(f"Cannot use {type(x).__name__} {x!r} as a kernel input; {_ACCEPTED}.")
