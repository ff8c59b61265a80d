"""The checks of `mtwork.metal_kernel`'s arguments and of its calls' that are mtwork's
own: MLX's, with MLX's words, are `msl.checks`. Each error names the argument, what was
given and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from . import dtypes
from .msl.body import METAL_ATTRIBUTES
from .msl.reserved import reserved_reason

__all__ = ["PREFIX", "check_flag", "check_init_value", "check_kernel_name", "check_names",
           "check_output_dtypes", "check_output_shapes", "check_sequence", "check_stream",
           "check_text"]

PREFIX = "[metal_kernel] "

_ATTRIBUTE_NAMES = frozenset(name for name, _ in METAL_ATTRIBUTES)


def _name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name.isidentifier():
        return f"must hold C identifiers, got {name!r}"
    reason = reserved_reason(name)
    if reason is not None:
        return f"cannot hold {name!r}: it is {reason}; choose another name"
    if name in _ATTRIBUTE_NAMES:
        return (f"cannot hold {name!r}: MLX passes the thread attribute of that name as a "
                f"parameter of its own; choose another name")
    return None


def check_names(value: Any, what: str) -> tuple[str, ...]:
    """`value` as the names of a kernel's inputs or outputs: distinct identifiers that
    MSL lets name a parameter."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{PREFIX}`{what}` must be a list of names, got {value!r}")
    for name in value:
        problem = _name_problem(name)
        if problem is not None:
            raise ValueError(f"{PREFIX}`{what}` {problem}")
    if len(set(value)) != len(value):
        raise ValueError(f"{PREFIX}`{what}` names a buffer twice: {list(value)}")
    return tuple(value)


def check_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{PREFIX}`{what}` must be MSL text (a str), got "
                        f"{type(value).__name__} {value!r}")
    return value


def check_kernel_name(name: Any) -> str:
    # MLX mangles `-` into `_` (0.32.4); anything else must already be an identifier part.
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise ValueError(f"{PREFIX}`name` must be a C identifier (letters, digits, _ or -), "
                         f"got {name!r}")
    return name


def check_flag(value: Any, what: str) -> bool:
    """`value` as True or False (MLX's binding takes a Python bool, nothing else)."""
    if not isinstance(value, bool):
        raise TypeError(f"{PREFIX}`{what}` must be True or False, got {value!r} "
                        f"({type(value).__name__})")
    return value


def check_output_shapes(output_shapes: Any) -> list[tuple[int, ...]]:
    shapes = []
    for i, shape in enumerate(output_shapes):
        ok = (isinstance(shape, Sequence) and not isinstance(shape, (str, bytes))
              and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                      for d in shape))
        if not ok:
            raise ValueError(f"{PREFIX}output_shapes[{i}] must be a sequence of integers, "
                             f"got {shape!r}")
        if any(d < 0 for d in shape):
            raise ValueError(f"{PREFIX}output_shapes[{i}] has a negative size: {shape!r}")
        shapes.append(tuple(int(d) for d in shape))
    return shapes


def check_output_dtypes(output_dtypes: Any) -> list[mx.Dtype]:
    kinds = []
    for i, dt in enumerate(output_dtypes):
        if not isinstance(dt, mx.Dtype):
            raise ValueError(f"{PREFIX}output_dtypes[{i}] must be an mlx dtype such as "
                             f"mx.float32, got {dt!r}")
        dtypes.type_string(dt)
        kinds.append(dt)
    return kinds


def check_stream(stream: Any, refusal: str = "[metal_kernel] Only supports the GPU.") -> Any:
    """`stream` (None, a stream or a device) if it is the GPU's, as MLX requires: MLX's
    GPU, or the device ``mx.gpu`` answers as under `mtwork.interpose` (the CPU off a
    Mac, where mtwork's kernels run); else ValueError(`refusal`)."""
    if stream is None:
        return None
    device = getattr(stream, "device", stream)
    kind = getattr(device, "type", device)
    if not isinstance(kind, mx.DeviceType) or kind not in (mx.DeviceType.gpu, mx.gpu):
        raise ValueError(refusal)
    return stream


def check_sequence(value: Any, what: str) -> list[Any]:
    if isinstance(value, (str, bytes, mx.array, np.ndarray)) or not isinstance(value, Sequence):
        raise TypeError(f"{PREFIX}`{what}` must be a list, got {type(value).__name__}")
    return list(value)


def check_init_value(init_value: Any) -> None:
    """A number (MLX takes it as a C++ float: ±inf and NaN too), or None."""
    if init_value is not None and (isinstance(init_value, (bool, np.bool_)) or not isinstance(
            init_value, (int, float, np.integer, np.floating))):
        raise ValueError(f"{PREFIX}`init_value` must be a number (a float; inf and nan "
                         f"too) or None, got {type(init_value).__name__} {init_value!r}")
