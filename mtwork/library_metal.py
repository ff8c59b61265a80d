"""The `metal` path of full-source kernels: a `mtwork.library.Kernel` run through
``mx.fast.metal_kernel``, its source as the header and a body that calls it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from .library import (
    _INCLUDE,
    THREADGROUP_MEMORY_ALIGNMENT,
    _Binding,
    _find_include,
    _included_files,
)
from .signature import (
    SCALAR_TYPES,
    KernelParam,
    function_constant_macros,
    rewrite_function_constants,
    type_info,
)

if TYPE_CHECKING:
    from .library import Kernel


@dataclass(frozen=True)
class MetalWrapper:
    """The arguments of ``mx.fast.metal_kernel`` that run a full-source kernel."""

    name: str
    header: str
    source: str
    input_names: list[str]
    output_names: list[str]
    template: list[tuple[str, Any]]


def _input_name(p: KernelParam) -> str:
    return f"__mtw_{p.name}"


def _in_device_space(type_text: str) -> str:
    """`type_text` with ``constant`` memory as read-only ``device`` memory."""
    if not re.search(r"\bconstant\b", type_text):
        return type_text
    qualifier = "device" if re.search(r"\bconst\b", type_text) else "const device"
    return re.sub(r"\bconstant\b", qualifier, type_text)


def _attribute_value(p: KernelParam) -> str:
    """The MLX body-form attribute (``uint`` or ``uint3``) converted to the declared type."""
    from .source import METAL_ATTRIBUTES

    mlx_type = dict(METAL_ATTRIBUTES)[p.attribute]
    info = type_info(p.type_text)
    lanes = info.lanes if info else 1
    if mlx_type == "uint3" and lanes < 3:
        source = f"{p.attribute}.x" if lanes == 1 else f"{p.attribute}.xy"
    else:
        source = p.attribute
    return f"{p.type_text}({source})"


def _metal_template(kernel: Kernel) -> tuple[list[tuple[str, Any]], list[str]]:
    """The template arguments given, as ``mx.fast.metal_kernel`` takes them, and body
    lines declaring the parameters left to their defaults."""
    out: list[tuple[str, Any]] = []
    for param, text in zip(kernel.signature.template_params, kernel.template_args):
        if param.is_type:
            if text not in SCALAR_TYPES:
                raise ValueError(f"template argument `{text}` of `{kernel.name}` is not a "
                                 f"dtype, so mx.fast.metal_kernel cannot take it")
            out.append((param.name, SCALAR_TYPES[text]))
        elif text in ("true", "false"):
            out.append((param.name, text == "true"))
        else:
            out.append((param.name, int(text, 0)))
    defaults = [
        f"  using {p.name} = {p.default};" if p.is_type
        else f"  constexpr {p.kind} {p.name} = {p.default};"
        for p in kernel.signature.template_params[len(kernel.template_args):]
    ]
    return out, defaults


def metal_wrapper(kernel: Kernel, bound: Sequence[str],
                  threadgroup_bytes: Mapping[int, int]) -> MetalWrapper:
    """Writes `kernel` as an ``mx.fast.metal_kernel`` body.

    The header is the library (function constants set, includes inlined); the body
    declares each parameter under its own name, then is the kernel's own body, so a
    ``threadgroup`` array it declares stays in a kernel function. Every buffer travels as
    an MLX input of at least 8 elements, which MLX binds in ``device`` memory: a
    parameter declared ``constant`` is declared ``device`` here, and a writable one drops
    the ``const`` MLX gives inputs (MLX outputs start uninitialised; a Metal buffer keeps
    what it holds). `bound` names the bound buffers; `threadgroup_bytes` sizes the
    ``[[threadgroup(n)]]`` arguments by index.
    """
    template, lines = _metal_template(kernel)
    inputs: list[str] = []
    for p in kernel.signature.params:
        ty = _in_device_space(p.type_text)
        if p.kind == "buffer" and p.name in bound:
            inputs.append(_input_name(p))
            if p.is_pointer:
                lines.append(f"  {ty} {p.name} = ({ty}){_input_name(p)};")
            else:
                lines.append(f"  {ty} {p.name} = *({ty[:-1]}*){_input_name(p)};")
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
    body = rewrite_function_constants(kernel.signature.body)
    lib = kernel.library
    macros = function_constant_macros({
        name: (c.type_text, kernel.constants.get(name))
        for name, c in lib.function_constants.items()
    })
    flat = _inline_includes(lib.prelude + "\n" + lib.text,
                            lib.path.parent if lib.path else None, lib.search_dirs)
    return MetalWrapper(
        name=f"mtw_{kernel.signature.name}",
        header=macros + rewrite_function_constants(flat) + "\n",
        source="\n".join(lines) + "\n" + body,
        input_names=inputs,
        output_names=["__mtw_unused"],
        template=template,
    )


def _mlx_prelude_files() -> set[Path]:
    """MLX's headers already in every custom kernel (utils.h and what it includes)."""
    from .backends.sim.compiler import mlx_include_dir

    root = mlx_include_dir()
    if root is None:
        return set()
    utils = (root / "mlx" / "backend" / "metal" / "kernels" / "utils.h").resolve()
    return {utils, *_included_files(utils.read_text(), utils.parent, [root])}


_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)


def _inline_includes(text: str, folder: Path | None, search_dirs: Sequence[Path]) -> str:
    """`text` with the user's and MLX's included files pasted in, once each (MLX compiles
    a custom kernel from one string); ``<...>`` system headers stay includes."""
    from .backends.sim.compiler import mlx_include_dir

    mlx_root = mlx_include_dir()
    dirs = [*search_dirs, *([mlx_root] if mlx_root else [])]
    seen = _mlx_prelude_files()

    def expand(current: str, here: Path | None) -> str:
        def replace(m: re.Match) -> str:
            path = _find_include(m.group("name"), m.group("open") == '"', here, dirs)
            if path is None:
                return m.group(0)
            if path in seen:
                return ""
            seen.add(path)
            return expand(_PRAGMA_ONCE.sub("", path.read_text()), path.parent)

        return _INCLUDE.sub(replace, current)

    return expand(_PRAGMA_ONCE.sub("", text), folder)


def run_on_metal(kernel: Kernel, bindings: list[_Binding], threadgroup_bytes: dict[int, int],
                  grid: tuple[int, int, int], tg: tuple[int, int, int]) -> None:
    wrapper = metal_wrapper(kernel, [b.param.name for b in bindings], threadgroup_bytes)
    options = {"math_mode": kernel.library.math_mode}
    run = mx.fast.metal_kernel(
        name=wrapper.name, input_names=wrapper.input_names, output_names=wrapper.output_names,
        source=wrapper.source, header=wrapper.header, ensure_row_contiguous=False,
        compile_options=options,
    )
    by_name = {b.param.name: b for b in bindings}
    inputs = []
    for name in wrapper.input_names:
        flat = by_name[name.removeprefix("__mtw_")].array.reshape(-1).view(np.uint8)
        padded = np.zeros(max(flat.size, 8), dtype=np.uint8)
        padded[: flat.size] = flat
        inputs.append(mx.array(padded))
    outputs = run(inputs=inputs, output_shapes=[(1,)], output_dtypes=[mx.float32], grid=grid,
                  threadgroup=tg, template=wrapper.template or None)
    mx.eval(outputs)
    # The kernel wrote into its inputs' memory: copy the writable ones back.
    for name, arr in zip(wrapper.input_names, inputs):
        b = by_name[name.removeprefix("__mtw_")]
        if b.param.writable:
            raw = np.array(arr)[: b.array.nbytes]
            np.copyto(b.array.reshape(-1).view(np.uint8), raw)
