"""Kernel source generation, byte for byte as ``mx.fast.metal_kernel`` does it.

MLX turns a kernel body into a full Metal function: it picks the parameters from the
body text, names the kernel after its template values and input/output dtypes, and
instantiates the template. mtwork must produce the same text so that a kernel checked
here behaves the same under MLX, and so that compiler messages line up.

The facts implemented here were read from MLX 0.32 (``mlx/backend/common/metal_kernel.cpp``
and ``python/src/fast.cpp``) and checked against the output of MLX 0.32.4 itself.
MLX's quirks are kept on purpose, because kernels written for MLX are written against them:

* parameters are found by plain substring search of the body (comments and longer
  identifiers count; the header is not searched);
* inputs with fewer than 8 elements live in the ``constant`` address space, and 0-d
  inputs are passed by reference and never get shape/strides/ndim buffers;
* the test that ends the parameter list ignores the shape/strides/ndim buffers, so with
  such a buffer, two or more outputs and no thread attributes, ``) {`` appears twice;
* the header is pasted with no newline after it;
* a template adds a second underscore before its hash in the kernel name, and bools are
  written as ``1``/``0``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import mlx.core as mx

from ..dtypes import as_mx_array, type_string
from .checks import TemplateValue, check_has_outputs, check_size, validate_template
from .template_names import template_hash, template_param_kind, template_text

__all__ = [
    "PRELUDE",
    "MAX_CONSTANT_ARRAY_SIZE",
    "METAL_ATTRIBUTES",
    "GeneratedSource",
    "HelperFlags",
    "InputInfo",
    "Param",
    "detect_attributes",
    "detect_shape_helpers",
    "generate",
    "kernel_name",
    "template_hash",
    "template_text",
]

# Inputs with fewer elements than this are bound in the `constant` address space.
MAX_CONSTANT_ARRAY_SIZE = 8

# Thread attributes MLX can inject, in the order it emits them (not order of use).
METAL_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)

# What MLX puts before every body-form kernel: the Metal standard library and its own
# kernel utilities (``metal::utils()``: elem_to_loc, Limits, bfloat16, 64-bit shuffles).
PRELUDE = '#include <metal_stdlib>\n#include "mlx/backend/metal/kernels/utils.h"\n'

# ---------------------------------------------------------------------------------------
# What the body uses


class HelperFlags(NamedTuple):
    """Which helper buffers an input gets: its shape, strides and ndim."""

    shape: bool
    strides: bool
    ndim: bool


def detect_shape_helpers(source: str, input_names: Sequence[str]) -> dict[str, HelperFlags]:
    """For each input name, whether ``name_shape``/``_strides``/``_ndim`` occur in the body.

    Plain substring search, as in MLX: ``max_shape`` counts for an input called ``x``.
    """
    return {
        n: HelperFlags(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
        for n in input_names
    }


def detect_attributes(source: str) -> list[tuple[str, str]]:
    """Thread attributes named in the body, as ``(name, msl_type)`` in MLX's table order.

    Plain substring search, so ``dispatch_threads_per_threadgroup`` also brings in
    ``threads_per_threadgroup``.
    """
    return [(attr, ty) for attr, ty in METAL_ATTRIBUTES if attr in source]


# ---------------------------------------------------------------------------------------
# Names


@dataclass(frozen=True)
class InputInfo:
    """What the generated text needs to know about one input."""

    dtype: mx.Dtype
    ndim: int
    size: int

    def __post_init__(self) -> None:
        type_string(self.dtype)  # refuse dtypes MLX cannot name
        if self.ndim < 0 or self.size < 0:
            raise ValueError(f"ndim and size must be >= 0, got ndim={self.ndim}, size={self.size}.")

    @classmethod
    def of(cls, arr: Any) -> InputInfo:
        """Describe an input; scalars and numpy values are converted as MLX does."""
        a = as_mx_array(arr)
        return cls(a.dtype, a.ndim, a.size)

    @property
    def is_scalar(self) -> bool:
        """0-d inputs are passed by reference and get no helper buffers."""
        return self.ndim == 0

    @property
    def in_constant_space(self) -> bool:
        return self.size < MAX_CONSTANT_ARRAY_SIZE


def _as_infos(inputs: Sequence[InputInfo | Any]) -> list[InputInfo]:
    return [i if isinstance(i, InputInfo) else InputInfo.of(i) for i in inputs]


def kernel_name(
    name: str,
    template: Iterable[tuple[str, Any]] | None,
    inputs: Sequence[InputInfo | Any],
    output_dtypes: Sequence[mx.Dtype],
) -> str:
    """The Metal function name MLX 0.32 gives a kernel call (its ``host_name``).

    ``custom_kernel_<name>``, then ``_`` + template hash (which itself starts with ``_``),
    then per input ``_<type>`` with ``s`` for 0-d or ``c`` for fewer than 8 elements,
    then per output ``_<type>``.
    """
    parts = [f"custom_kernel_{name}"]
    text = template_text(template)
    if text:
        parts.append("_" + template_hash(text))
    for info in _as_infos(inputs):
        suffix = "s" if info.is_scalar else ("c" if info.in_constant_space else "")
        parts.append(f"_{type_string(info.dtype)}{suffix}")
    parts.extend(f"_{type_string(d)}" for d in output_dtypes)
    return "".join(parts)


# ---------------------------------------------------------------------------------------
# The signature

ParamKind = Literal["input", "shape", "strides", "ndim", "output", "attribute"]

_HELPER_TYPES: dict[str, tuple[str, bool]] = {
    # kind: (msl type, passed by reference)
    "shape": ("int", False),
    "strides": ("int64_t", False),
    "ndim": ("int", True),
}


@dataclass(frozen=True)
class Param:
    """One parameter of the generated kernel function.

    For ``shape``/``strides``/``ndim`` the name is the full parameter name
    (``inp_shape``) and ``input_index`` says which input it describes. For atomic
    outputs ``msl_type`` is the element type; the text wraps it in ``atomic<...>``.
    """

    kind: ParamKind
    name: str
    msl_type: str
    buffer_index: int | None
    address_space: Literal["device", "constant"] | None
    by_reference: bool = False
    input_index: int | None = None
    dtype: mx.Dtype | None = None
    atomic: bool = False

    def declaration(self) -> str:
        """The parameter as MLX writes it, indented, without the separator."""
        if self.kind == "attribute":
            return f"  {self.msl_type} {self.name} [[{self.name}]]"
        ref = "&" if self.by_reference else "*"
        binding = f"[[buffer({self.buffer_index})]]"
        if self.kind == "output":
            ty = f"atomic<{self.msl_type}>" if self.atomic else self.msl_type
            return f"  device {ty}{ref} {self.name} {binding}"
        return f"  const {self.address_space} {self.msl_type}{ref} {self.name} {binding}"


@dataclass(frozen=True)
class GeneratedSource:
    """The kernel text MLX would build for one call, and how it is laid out."""

    name: str  # the name given to metal_kernel (used by the verbose print)
    text: str  # header + signature + body + instantiation: what Metal compiles after the prelude
    host_name: str  # the Metal function name, also the kernel name
    params: list[Param]
    template: list[tuple[str, TemplateValue]]
    header_lines: int  # lines 1..header_lines of `text` are the header's
    body_line: int  # the line of `text` where the body starts
    body_lines: int

    @property
    def function(self) -> str:
        """The C++ function to call: the host name with its template arguments."""
        return self.host_name + template_text(self.template)

    def verbose_text(self) -> str:
        """What MLX prints to stdout when the kernel is called with ``verbose=True``."""
        return f"Generated source code for `{self.name}`:\n```\n{self.text}\n```\n"

    def params_of(self, kind: ParamKind) -> list[Param]:
        return [p for p in self.params if p.kind == kind]


def _build_params(
    input_names: Sequence[str],
    output_names: Sequence[str],
    infos: Sequence[InputInfo],
    helpers: Mapping[str, HelperFlags],
    output_dtypes: Sequence[mx.Dtype],
    atomic_outputs: bool,
    attributes: Sequence[tuple[str, str]],
) -> list[Param]:
    params: list[Param] = []
    index = 0
    for i, (n, info) in enumerate(zip(input_names, infos, strict=True)):
        params.append(
            Param(
                kind="input",
                name=n,
                msl_type=type_string(info.dtype),
                buffer_index=index,
                address_space="constant" if info.in_constant_space else "device",
                by_reference=info.is_scalar,
                input_index=i,
                dtype=info.dtype,
            )
        )
        index += 1
        if info.is_scalar:
            continue
        for kind, wanted in zip(("shape", "strides", "ndim"), helpers[n], strict=True):
            if wanted:
                ty, by_ref = _HELPER_TYPES[kind]
                params.append(
                    Param(kind, f"{n}_{kind}", ty, index, "constant", by_ref, input_index=i)
                )
                index += 1
    for n, dt in zip(output_names, output_dtypes, strict=True):
        params.append(
            Param("output", n, type_string(dt), index, "device", dtype=dt, atomic=atomic_outputs)
        )
        index += 1
    params.extend(Param("attribute", a, ty, None, None) for a, ty in attributes)
    return params


def _write_signature(host_name: str, params: Sequence[Param], n_inputs: int) -> str:
    lines: list[str] = []
    n_outputs = sum(p.kind == "output" for p in params)
    n_attrs = sum(p.kind == "attribute" for p in params)
    # MLX's test for the last buffer counts inputs and outputs only, not helper buffers:
    # with helpers and no attributes it closes the list early (and again at the end).
    last_buffer = n_inputs + n_outputs - 1
    attr_seen = 0
    for p in params:
        if p.kind == "output":
            more = p.buffer_index < last_buffer or n_attrs > 0
        elif p.kind == "attribute":
            attr_seen += 1
            more = attr_seen < n_attrs
        else:
            more = True
        lines.append(p.declaration() + (",\n" if more else ") {\n"))
    return f"[[kernel]] void {host_name}(\n" + "".join(lines)


def generate(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    atomic_outputs: bool = False,
    template: Iterable[tuple[str, Any]] | None = None,
    inputs: Sequence[InputInfo | Any] = (),
    output_dtypes: Sequence[mx.Dtype] = (),
) -> GeneratedSource:
    """Build the kernel text MLX 0.32 generates for one call, byte for byte.

    ``inputs`` describe the call's inputs (``InputInfo``, or arrays/scalars which are
    described with :meth:`InputInfo.of`). The result is shared by calls with the same
    arguments (a cached call skips the generation): treat it as read-only.
    """
    return _generate(name, tuple(input_names), tuple(output_names), source, header,
                     atomic_outputs, tuple(validate_template(template)),
                     tuple(_as_infos(inputs)), tuple(output_dtypes))


@lru_cache(maxsize=256)
def _generate(name: str, input_names: tuple[str, ...], output_names: tuple[str, ...],
              source: str, header: str, atomic_outputs: bool, targs: tuple, infos: tuple,
              output_dtypes: tuple) -> GeneratedSource:
    check_has_outputs(output_names)
    check_size(len(infos), len(input_names), "inputs")
    check_size(len(output_dtypes), len(output_names), "output_dtypes")
    host = kernel_name(name, targs, infos, output_dtypes)
    params = _build_params(
        input_names,
        output_names,
        infos,
        detect_shape_helpers(source, input_names),
        output_dtypes,
        atomic_outputs,
        detect_attributes(source),
    )

    parts = [header]
    if targs:
        decl = ", ".join(f"{template_param_kind(v)} {n}" for n, v in targs)
        parts.append(f"template <{decl}>\n")
    parts.append(_write_signature(host, params, len(infos)))
    body_line = "".join(parts).count("\n") + 1
    parts.append(source)
    parts.append("\n}\n")
    if targs:
        inst = host + template_text(targs)
        parts.append(
            f'\ntemplate [[host_name("{host}")]] [[kernel]] decltype({inst}) {inst};\n'
        )
    return GeneratedSource(
        name=name, text="".join(parts), host_name=host, params=params, template=list(targs),
        header_lines=_line_count(header), body_line=body_line,
        body_lines=source.count("\n") + 1,
    )


def _line_count(text: str) -> int:
    """The lines `text` occupies (a last line without a newline counts)."""
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)
