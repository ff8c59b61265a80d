"""Template arguments and constant values written as MSL source text.

A kernel template's arguments come from Python as dtypes, Python types, numbers or Metal
text; function-constant values as the bytes of their declared type. Both end up as the
text a C++ compiler reads (``float``, ``4``, ``true``, ``0.5f``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from .. import dtypes
from ..errors import CompileError
from .signature import KernelSignature, TemplateParam
from .types import METAL_TYPE_NAMES, TypeInfo

__all__ = ["literal", "substitute", "template_texts", "type_text"]




def type_text(value: Any) -> str | None:
    """Metal's name for a type given as an mx dtype, numpy dtype or Python type."""
    if isinstance(value, mx.Dtype):
        return METAL_TYPE_NAMES.get(value)
    if value is bool:
        return "bool"
    if value is int:
        return "int"
    if value is float:
        return "float"
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        return None
    for mx_dtype, name in METAL_TYPE_NAMES.items():
        if mx_dtype != mx.bfloat16 and dtypes.storage_numpy_dtype(mx_dtype) == np_dtype:
            return name
    return None


def _value_text(param: TemplateParam, value: Any, kernel: str) -> str:
    if isinstance(value, str):
        return value.strip()
    if param.is_type:
        text = type_text(value)
        if text is None:
            raise CompileError(kernel, f"template parameter `{param.name}` is a type; "
                                       f"{value!r} is not a Metal type")
        return text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    raise CompileError(kernel, f"template parameter `{param.kind} {param.name}` takes a "
                               f"value, not {value!r}")


def template_texts(signature: KernelSignature, template: Any, label: str) -> tuple[str, ...]:
    """The template arguments written out, up to the last one given (the parameters after
    it keep their defaults, as in C++)."""
    params = signature.template_params
    if not params:
        if template:
            raise CompileError(label, f"`{signature.name}` is not a template")
        return ()
    if template is None:
        template = {}
    if isinstance(template, Mapping):
        unknown = set(template) - {p.name for p in params}
        if unknown:
            raise CompileError(label, f"`{signature.name}` has no template parameter "
                                      f"{', '.join(map(repr, sorted(unknown)))}")
        values = [template.get(p.name) for p in params]
    else:
        values = list(template) if isinstance(template, (list, tuple)) else [template]
        if len(values) > len(params):
            raise CompileError(label, f"`{signature.name}` takes {len(params)} template "
                                      f"arguments, got {len(values)}")
        values += [None] * (len(params) - len(values))
    while values and values[-1] is None and params[len(values) - 1].default is not None:
        values.pop()
    texts = []
    for p, v in zip(params, values):
        if v is None and p.default is None:
            raise CompileError(label, _missing_template_message(signature, p))
        texts.append(substitute(p.default, dict(zip([q.name for q in params], texts)))
                     if v is None else _value_text(p, v, label))
    return tuple(texts)


def substitute(text: str, names: Mapping[str, str]) -> str:
    """`text` with each template parameter name replaced by its argument."""
    if not names:
        return text
    pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], text)


def _missing_template_message(signature: KernelSignature, param: TemplateParam) -> str:
    kinds = ", ".join(f"{p.kind} {p.name}" for p in signature.template_params)
    return (f"`{signature.name}` is a template <{kinds}> and no value was given for "
            f"`{param.name}`: pass template=(...) or use a host name of its instantiations")


def literal(bits: np.ndarray, info: TypeInfo) -> str:
    """A C++ literal of the converted scalar `bits` (storage dtype)."""
    if info.dtype == mx.bool_:
        return "true" if bool(bits.reshape(-1)[0]) else "false"
    if info.dtype == mx.bfloat16:
        value = float(np.array(mx.array(bits.reshape(-1)[:1]).view(mx.bfloat16)
                               .astype(mx.float32))[0])
    else:
        value = bits.reshape(-1)[0].item()
    if isinstance(value, float):
        if not np.isfinite(value):
            raise ValueError(f"function constants must be finite, got {value}")
        return repr(float(np.float32(value))) + "f"
    return str(value)
