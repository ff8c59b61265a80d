"""A full-source kernel written as an MLX body-form kernel, for ``mx.fast.metal_kernel``.

MLX runs custom kernels in its body form only. To run a whole ``[[kernel]]`` function
through it, the library becomes the header (function constants set, includes pasted in)
and the body declares each of the kernel's parameters under its own name, then is the
kernel's own body, so a ``threadgroup`` array it declares stays in a kernel function.

Every buffer travels as an MLX input of at least 8 bytes, which MLX binds in ``device``
memory: a parameter declared ``constant`` is declared ``device`` here, and a writable one
drops the ``const`` MLX gives inputs. MLX arrays are immutable values, so a writable
buffer's input is a fresh copy made for the call, and its writes are copied back to the
caller's buffer afterwards: the caller's own ``mx.array`` is never changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..limits import THREADGROUP_MEMORY_ALIGNMENT
from .body import METAL_ATTRIBUTES
from .constants import rewrite_function_constants
from .signature import KernelParam, KernelSignature
from .types import SCALAR_TYPES, type_info

__all__ = ["MetalWrapper", "input_name", "wrap"]


@dataclass(frozen=True)
class MetalWrapper:
    """The arguments of ``mx.fast.metal_kernel`` (and its call's template) that run a
    full-source kernel."""

    name: str
    header: str
    source: str
    input_names: list[str]
    output_names: list[str]
    template: list[tuple[str, Any]]


def input_name(p: KernelParam) -> str:
    """The MLX input that carries parameter `p`'s buffer."""
    return f"__mtw_{p.name}"


def _in_device_space(type_text: str) -> str:
    """`type_text` with ``constant`` memory as read-only ``device`` memory."""
    if not re.search(r"\bconstant\b", type_text):
        return type_text
    qualifier = "device" if re.search(r"\bconst\b", type_text) else "const device"
    return re.sub(r"\bconstant\b", qualifier, type_text)


def _attribute_value(p: KernelParam) -> str:
    """The MLX body-form attribute (``uint`` or ``uint3``) converted to the declared type."""
    mlx_type = dict(METAL_ATTRIBUTES)[p.attribute]
    info = type_info(p.type_text)
    lanes = info.lanes if info else 1
    if mlx_type == "uint3" and lanes < 3:
        source = f"{p.attribute}.x" if lanes == 1 else f"{p.attribute}.xy"
    else:
        source = p.attribute
    return f"{p.type_text}({source})"


def _template(signature: KernelSignature, template_args: Sequence[str], label: str
              ) -> tuple[list[tuple[str, Any]], list[str]]:
    """The template arguments given, as ``mx.fast.metal_kernel`` takes them, and body
    lines declaring the parameters left to their defaults."""
    out: list[tuple[str, Any]] = []
    for param, text in zip(signature.template_params, template_args):
        if param.is_type:
            if text not in SCALAR_TYPES:
                raise ValueError(f"template argument `{text}` of `{label}` is not a dtype, "
                                 f"so mx.fast.metal_kernel cannot take it")
            out.append((param.name, SCALAR_TYPES[text]))
        elif text in ("true", "false"):
            out.append((param.name, text == "true"))
        else:
            out.append((param.name, int(text, 0)))
    defaults = [
        f"  using {p.name} = {p.default};" if p.is_type
        else f"  constexpr {p.kind} {p.name} = {p.default};"
        for p in signature.template_params[len(template_args):]
    ]
    return out, defaults


def _parameter_lines(signature: KernelSignature, bound: Sequence[str],
                     threadgroup_bytes: Mapping[int, int]) -> tuple[list[str], list[str]]:
    """The MLX inputs, and body lines declaring each kernel parameter from them."""
    inputs: list[str] = []
    lines: list[str] = []
    for p in signature.params:
        ty = _in_device_space(p.type_text)
        if p.kind == "buffer" and p.name in bound:
            inputs.append(input_name(p))
            if p.is_pointer:
                lines.append(f"  {ty} {p.name} = ({ty}){input_name(p)};")
            else:
                lines.append(f"  {ty} {p.name} = *({ty[:-1]}*){input_name(p)};")
        elif p.kind == "buffer":  # absent: its function constant is false
            null = "nullptr" if p.is_pointer else f"*({ty[:-1]}*)nullptr"
            lines.append(f"  {ty} {p.name} = {null};")
        elif p.kind == "threadgroup":
            storage = f"__mtw_threadgroup_{p.index}"
            count = threadgroup_bytes[p.index] // THREADGROUP_MEMORY_ALIGNMENT  # type: ignore
            lines.append(f"  threadgroup float4 {storage}[{count}];")
            lines.append(f"  {p.type_text} {p.name} = ({p.type_text}){storage};")
        else:
            lines.append(f"  {p.type_text} {p.name} = {_attribute_value(p)};")
    return inputs, lines


def wrap(signature: KernelSignature, template_args: Sequence[str], defines: str,
         library_text: str, *,
         bound: Sequence[str], threadgroup_bytes: Mapping[int, int],
         label: str) -> MetalWrapper:
    """`signature`'s kernel as an ``mx.fast.metal_kernel`` body.

    `library_text` is the library with its includes pasted in (see
    `includes.inline_includes`); `defines` are the ``#define`` lines that come first (the
    library's macros and its function constants' values);
    `bound` names the bound buffers; `threadgroup_bytes` sizes the ``[[threadgroup(n)]]``
    arguments by index.
    """
    template, lines = _template(signature, template_args, label)
    inputs, declarations = _parameter_lines(signature, bound, threadgroup_bytes)
    return MetalWrapper(
        name=f"mtw_{signature.name}",
        header=defines + rewrite_function_constants(library_text) + "\n",
        source="\n".join(lines + declarations) + "\n"
        + rewrite_function_constants(signature.body),
        input_names=inputs,
        output_names=["__mtw_unused"],
        template=template,
    )
