"""A full-source kernel written as an MLX body-form kernel, for ``mx.fast.metal_kernel``.

MLX runs custom kernels in its body form only. To run a whole ``[[kernel]]`` function
through it, the library becomes the header (function constants set, includes pasted in)
and the body sets the template's arguments (``using T = float;``: any argument works, a
type, a value or a function), captures the thread attributes MLX passes, then opens a
block that declares each of the kernel's parameters under its own name (shadowing an
attribute of the same name) and holds the kernel's own body, so a ``threadgroup`` array
it declares stays in a kernel function.

Every buffer travels as an MLX input. MLX binds an input of fewer than 8 elements in
``constant`` memory and a larger one in ``device`` memory, and Metal converts no pointer
between the two: a ``constant`` parameter of at most `CONSTANT_CARRIER_BYTES` (MLX's shape
and strides, an ``int&``, a small struct) travels as fewer than 8 ``uint64`` elements and
stays ``constant``, so the kernel's body may pass it on to functions that take constant
memory (MLX's ``elem_to_loc``); a larger one travels as bytes and is declared ``device``
here (Apple's compiler refuses the kernel where its body passes that on as ``constant``).
A writable parameter drops the ``const`` MLX gives inputs. MLX arrays are immutable
values, so a writable buffer's input is a fresh copy made for the call, and its writes
are copied back to the caller's buffer afterwards: the caller's own ``mx.array`` is never
changed. One buffer bound at several indices (as a Metal host binds one ``MTLBuffer``
twice; llama.cpp's soft_max tells an absent mask by its address being src0's) travels as
one input that every such parameter points at.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..limits import THREADGROUP_MEMORY_ALIGNMENT
from .body import METAL_ATTRIBUTES
from .constants import rewrite_function_constants
from .signature import KernelParam, KernelSignature
from .types import type_info

__all__ = ["CONSTANT_CARRIER_BYTES", "MetalWrapper", "input_name", "wrap"]

# The most bytes an input of fewer than 8 elements (MLX's limit for `constant` inputs) of
# MLX's widest dtype, 8 bytes, holds.
CONSTANT_CARRIER_BYTES = 7 * 8


@dataclass(frozen=True)
class MetalWrapper:
    """The arguments of ``mx.fast.metal_kernel`` that run a full-source kernel (its template
    arguments are set in the body, so the call takes none)."""

    name: str
    header: str
    source: str
    input_names: list[str]
    output_names: list[str]


def input_name(p: KernelParam) -> str:
    """The MLX input that carries parameter `p`'s buffer, named by its index: MLX adds
    shape/strides buffers for an input whose name followed by ``_shape`` (...) occurs in
    the body, so inputs named after parameters would clash where one parameter is called
    after another (MLX's qmv has ``x`` and ``x_shape``)."""
    return f"__mtw_buffer{p.index}"


def _in_device_space(type_text: str) -> str:
    """`type_text` with ``constant`` memory as read-only ``device`` memory."""
    if not re.search(r"\bconstant\b", type_text):
        return type_text
    qualifier = "device" if re.search(r"\bconst\b", type_text) else "const device"
    return re.sub(r"\bconstant\b", qualifier, type_text)


def _attribute_value(p: KernelParam, captured: str) -> str:
    """The MLX body-form attribute captured as `captured` (``uint`` or ``uint3``),
    converted to the declared type."""
    mlx_type = dict(METAL_ATTRIBUTES)[p.attribute]
    info = type_info(p.type_text)
    lanes = info.lanes if info else 1
    if mlx_type == "uint3" and lanes < 3:
        captured += ".x" if lanes == 1 else ".xy"
    return f"{p.type_text}({captured})"


def _template_lines(signature: KernelSignature, template_args: Sequence[str]) -> list[str]:
    """Body lines that give every template parameter its argument (or its default): the
    body is not a template, so any argument works — a type, a value, a function."""
    lines, given = [], dict(zip((p.name for p in signature.template_params), template_args))
    for p in signature.template_params:
        text = given.get(p.name, p.default)
        if p.is_type:
            lines.append(f"  using {p.name} = {text};")
        elif "(*)" in p.kind:  # a function pointer, typed: the function may be a template
            declarator = p.kind.replace("(*)", f"(*{p.name})", 1)
            lines.append(f"  constexpr {declarator} = {text};")
        elif type_info(p.kind) is None:  # a named type, maybe a function's: _VALUE_TYPE
            lines.append(f"  constexpr __mtw_value_t<{p.kind}> {p.name} = {text};")
        else:
            lines.append(f"  constexpr {p.kind} {p.name} = {text};")
    return lines


# The type of a template parameter of a named type: a function type (llama.cpp's
# ``template<mul_mv_disp_fn_t disp_fn>``, the typedef a decltype of a function) means a
# pointer to such a function (C++ [temp.param]); the argument may name an overloaded
# function template, which only that target type resolves. Any other type is itself.
_VALUE_TYPE = """template <typename T> struct __mtw_value { using type = T; };
template <typename R, typename... A> struct __mtw_value<R(A...)> { using type = R (*)(A...); };
template <typename T> using __mtw_value_t = typename __mtw_value<T>::type;
"""


def _parameter_lines(signature: KernelSignature, bound: Sequence[str],
                     threadgroup_bytes: Mapping[int, int], aliases: Mapping[str, str],
                     constant: Collection[str] = ()
                     ) -> tuple[list[str], list[str], list[str]]:
    """The MLX inputs; lines for the kernel function's scope (attribute values captured,
    threadgroup memory); and lines for the body's block declaring each parameter (a
    parameter may be named like the attribute MLX passes, which it then shadows)."""
    inputs: list[str] = []
    outer: list[str] = []
    inner: list[str] = []
    by_name = {q.name: q for q in signature.params}
    for k, p in enumerate(signature.params):
        ty = p.type_text if p.name in constant else _in_device_space(p.type_text)
        if p.kind == "buffer" and p.name in bound:
            carrier = input_name(by_name[aliases.get(p.name, p.name)])
            if p.name not in aliases:
                inputs.append(carrier)
            if p.is_pointer:
                inner.append(f"  {ty} {p.name} = ({ty}){carrier};")
            else:
                inner.append(f"  {ty} {p.name} = *({ty[:-1]}*){carrier};")
        elif p.kind == "buffer":  # absent (its function constant is false) or unbound
            null = "nullptr" if p.is_pointer else f"*({p.type_text[:-1]}*)nullptr"
            inner.append(f"  {p.type_text} {p.name} = {null};")
        elif p.kind == "threadgroup":
            storage = f"__mtw_threadgroup_{p.index}"
            count = threadgroup_bytes[p.index] // THREADGROUP_MEMORY_ALIGNMENT  # type: ignore
            outer.append(f"  threadgroup float4 {storage}[{count}];")
            inner.append(f"  {p.type_text} {p.name} = ({p.type_text}){storage};")
        else:
            captured = f"__mtw_attribute{k}"
            outer.append(f"  const auto {captured} = {p.attribute};")
            inner.append(f"  {p.type_text} {p.name} = {_attribute_value(p, captured)};")
    return inputs, outer, inner


def wrap(signature: KernelSignature, template_args: Sequence[str], defines: str,
         library_text: str, *, bound: Sequence[str], threadgroup_bytes: Mapping[int, int],
         aliases: Mapping[str, str] | None = None,
         constant: Collection[str] = ()) -> MetalWrapper:
    """`signature`'s kernel as an ``mx.fast.metal_kernel`` body.

    `library_text` is the library with its includes pasted in (see
    `includes.inline_includes`); `defines` are the ``#define`` lines that come first (the
    library's macros and its function constants' values);
    `bound` names the bound buffers; `threadgroup_bytes` sizes the ``[[threadgroup(n)]]``
    arguments by index; `aliases` maps a bound buffer to the earlier one whose memory it
    is (it gets no input of its own); `constant` names the ``constant`` parameters that
    travel in constant memory (inputs of fewer than 8 elements).
    """
    inputs, outer, inner = _parameter_lines(signature, bound, threadgroup_bytes,
                                            aliases or {}, constant)
    template_lines = _template_lines(signature, template_args)
    lines = template_lines + outer + ["  {"] + inner
    helper = _VALUE_TYPE if any("__mtw_value_t<" in t for t in template_lines) else ""
    return MetalWrapper(
        name=f"mtw_{signature.name}",
        header=defines + rewrite_function_constants(library_text) + "\n" + helper,
        source="\n".join(lines) + "\n" + rewrite_function_constants(signature.body) + "\n  }",
        input_names=inputs,
        output_names=["__mtw_unused"],
    )
