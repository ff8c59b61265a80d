"""The argument checks of ``mx.fast.metal_kernel``, with MLX's own messages (raised as
ValueError or TypeError, as MLX's Python binding does), so that a call refused by MLX is
refused here with the same words. Read from MLX 0.32 (``python/src/fast.cpp``,
``mlx/backend/common/metal_kernel.cpp``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mlx.core as mx

from ..dtypes import INT32_MAX, INT32_MIN
from .reserved import reserved_reason

__all__ = [
    "MATH_MODES",
    "TemplateValue",
    "check_call_sizes",
    "check_gpu_dtypes",
    "check_has_outputs",
    "check_size",
    "validate_compile_options",
    "validate_template",
]

MATH_MODES: tuple[str, ...] = ("safe", "relaxed", "fast")

TemplateValue = bool | int | mx.Dtype

_PREFIX = "[metal_kernel]"
_INVALID_TEMPLATE = (
    f"{_PREFIX} Invalid template argument. Must be `mlx.core.Dtype`, `int` or `bool`."
)
_INVALID_MATH_MODE = f"{_PREFIX} Expected math_mode to be 'safe', 'relaxed', or 'fast'."


def check_size(actual: int, expected: int, what: str) -> None:
    """Raise MLX's count mismatch error for the call argument ``what``.

    MLX ends this message with a newline; it is kept so that the text matches.
    """
    if actual != expected:
        raise ValueError(
            f"{_PREFIX} Expected `{what}` to have size {expected} but got size {actual}.\n"
        )


def check_call_sizes(
    input_names: Sequence[str],
    output_names: Sequence[str],
    inputs: Sequence[Any],
    output_shapes: Sequence[Any],
    output_dtypes: Sequence[Any],
) -> None:
    """The three call-time count checks, in MLX's order."""
    check_size(len(inputs), len(input_names), "inputs")
    check_size(len(output_shapes), len(output_names), "output_shapes")
    check_size(len(output_dtypes), len(output_names), "output_dtypes")


def check_has_outputs(output_names: Sequence[str]) -> None:
    """A kernel must write somewhere; MLX refuses one without outputs when it is made."""
    if len(output_names) == 0:
        raise ValueError(f"{_PREFIX} Must specify at least one output.")


def check_gpu_dtypes(input_dtypes: Iterable[mx.Dtype], output_dtypes: Iterable[mx.Dtype]) -> None:
    """Refuse float64 inputs and outputs, as MLX's GPU arrays do.

    MLX still generates (and prints) the source first; the refusal comes when the
    output arrays are made, so :func:`generate` itself accepts float64.
    """
    if any(d == mx.float64 for d in (*input_dtypes, *output_dtypes)):
        raise ValueError("float64 is not supported on the GPU")


def validate_template(
    template: Iterable[tuple[str, Any]] | None,
) -> list[tuple[str, TemplateValue]]:
    """Check template arguments and return them as a list of ``(name, value)``.

    Values are classified as MLX does: ``bool`` first (so ``True`` is not an int), then
    ``int`` (a C ``int``, so it must fit in 32 bits), then ``mx.Dtype``. numpy scalars
    are refused, as MLX refuses them.
    """
    if template is None:
        return []
    if isinstance(template, (str, bytes, Mapping)):
        raise TypeError(
            f"template must be a list of (name, value) pairs, not {type(template).__name__}."
        )
    out: list[tuple[str, TemplateValue]] = []
    for item in template:
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
            raise TypeError(f"template entries must be (name: str, value) pairs, got {item!r}.")
        name, value = item
        _check_template_name(name)
        if isinstance(value, bool):
            out.append((name, value))
        elif isinstance(value, int):
            if not INT32_MIN <= value <= INT32_MAX:
                raise ValueError(
                    f"{_INVALID_TEMPLATE} Got int {value} for `{name}`, outside the 32-bit range."
                )
            out.append((name, value))
        elif isinstance(value, mx.Dtype):
            out.append((name, value))
        else:
            raise ValueError(
                f"{_INVALID_TEMPLATE} Got {type(value).__name__} {value!r} for `{name}`."
            )
    return out


def _check_template_name(name: str) -> None:
    """A template parameter's name must be one MSL can declare (mtwork's check: MLX
    would write it into the source and fail to compile)."""
    reason = None if not name.isidentifier() else reserved_reason(name)
    if not name.isidentifier() or reason is not None:
        why = f": it is {reason}" if reason else ""
        raise ValueError(f"template names must be C identifiers MSL allows, got {name!r}{why}")


def validate_compile_options(opts: Mapping[str, Any] | None) -> str:
    """Check ``compile_options`` and return its math mode (``"safe"`` by default)."""
    if opts is None:
        return "safe"
    if not isinstance(opts, dict):
        raise ValueError(f"{_PREFIX} Expected `compile_options` to be a dict.")
    math_mode = "safe"
    for key, value in opts.items():
        if key != "math_mode":
            raise ValueError(f"{_PREFIX} Unknown compile option `{key}`.")
        if not isinstance(value, str) or value not in MATH_MODES:
            raise ValueError(_INVALID_MATH_MODE)
        math_mode = value
    return math_mode
