"""The `sim` backend: MSL compiled with clang against mtwork's Metal shim, GPU threads
run as fibers on all CPU cores."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ... import dtypes
from ...errors import KernelDeadlock, KernelFault, KernelTimeout, ThreadgroupMemoryError
from ...sanitizer import KINDS as SANITIZER_KINDS
from ...sanitizer import Finding, SanitizerReport, symbolize
from ...source import GeneratedSource, Param, template_text
from . import compiler, runtime
from .launcher import LaunchParam, launcher_source
from .rewrite import rewrite_msl

NAME = "sim"

# Outputs not given an init_value start as this pattern, so code that forgets to write
# an element shows up: NaN with a recognisable payload for floats, 0xBE bytes otherwise.
_POISON_BITS = {
    mx.float32: np.uint32(0x7FC0BADD),
    mx.float16: np.uint16(0x7EBA),
    mx.bfloat16: np.uint16(0x7FBA),
    mx.complex64: np.uint32(0x7FC0BADD),
}

_TU_PRELUDE = '#include <metal_stdlib>\n#include "mlx/backend/metal/kernels/utils.h"\n'


# Calls that can suspend a thread. A kernel without any runs as plain loops per threadgroup
# (see launcher.py); the runtime reports it if one slips through.
_BLOCKING = re.compile(
    r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+|threadgroup|"
    r"simdgroup_(?!index_in_threadgroup\b)\w+|schedule_row_tile)\b"
)


def is_barrier_free(*texts: str) -> bool:
    """Whether kernel text never blocks (no barriers, SIMD functions or threadgroup memory)."""
    if os.environ.get("MTWORK_SIM_BARRIER_FREE", "1") == "0":
        return False
    return not any(_BLOCKING.search(t) for t in texts)


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here, or None when it can."""
    try:
        compiler.compiler_command()
    except Exception as exc:  # noqa: BLE001 - report any cause
        return str(exc)
    if compiler.mlx_include_dir() is None:
        return "the installed mlx package has no Metal kernel headers"
    return None


def poisoned(dtype: mx.Dtype, shape: Sequence[int]) -> np.ndarray:
    out = np.empty(tuple(shape), dtype=dtypes.storage_numpy_dtype(dtype))
    pattern = _POISON_BITS.get(dtype)
    if pattern is None:
        out.reshape(-1).view(np.uint8).fill(0xBE)
    else:
        out.reshape(-1).view(pattern.dtype).fill(pattern)
    return out


def filled(dtype: mx.Dtype, shape: Sequence[int], value: float) -> np.ndarray:
    one = mx.array(value).astype(dtype)
    bits = np.array(one.view(mx.uint16)) if dtype == mx.bfloat16 else np.array(one)
    return np.full(tuple(shape), bits, dtype=dtypes.storage_numpy_dtype(dtype))


def _numpy_view(arr: mx.array) -> np.ndarray:
    """The array's memory as numpy (no copy); bfloat16 as uint16."""
    if arr.dtype == mx.bfloat16:
        arr = arr.view(mx.uint16)
    return np.array(arr, copy=False)


def _launch_params(params: Sequence[Param]) -> list[LaunchParam]:
    out = []
    for p in params:
        if p.kind == "attribute":
            out.append(LaunchParam("attribute", p.msl_type, attribute=p.name))
            continue
        ref = "&" if p.by_reference else "*"
        if p.kind == "output":
            element = f"atomic<{p.msl_type}>" if p.atomic else p.msl_type
            out.append(LaunchParam("buffer", f"device {element}*", slot=p.buffer_index))
        else:
            out.append(
                LaunchParam("buffer", f"const {p.address_space} {p.msl_type}{ref}",
                            slot=p.buffer_index)
            )
    return out


@dataclass(frozen=True)
class _Compiled:
    library: runtime.KernelLibrary
    translation: compiler.Translation


_compiled: dict[tuple[str, str, bool], _Compiled] = {}
_compiled_lock = threading.Lock()


def _translation(gen: GeneratedSource, header: str, body: str) -> compiler.Translation:
    text = rewrite_msl(gen.text).text
    prelude_lines = _TU_PRELUDE.count("\n")
    body_pos = len(gen.text) - len(body + "\n}\n") - _instantiation_length(gen)
    body_first = gen.text[:body_pos].count("\n") + 1
    regions = []
    if header:
        regions.append((prelude_lines + 1, prelude_lines + header.count("\n") + 1, "header",
                        prelude_lines))
    regions.append((prelude_lines + body_first, prelude_lines + body_first + body.count("\n"),
                    "source", prelude_lines + body_first - 1))
    function = gen.host_name + (_template_args(gen) or "")
    launcher = launcher_source(function, _launch_params(gen.params))
    return compiler.Translation(_TU_PRELUDE + text + launcher, tuple(regions))


def _template_args(gen: GeneratedSource) -> str:
    return template_text(gen.template)


def _instantiation_length(gen: GeneratedSource) -> int:
    args = _template_args(gen)
    if not args:
        return 0
    full = gen.host_name + args
    return len(
        f'\ntemplate [[host_name("{gen.host_name}")]] [[kernel]] decltype({full}) {full};\n'
    )


def compile_body_kernel(gen: GeneratedSource, header: str, body: str, math_mode: str,
                        label: str, sanitize: bool = False) -> _Compiled:
    key = (gen.text, math_mode, sanitize)
    with _compiled_lock:
        hit = _compiled.get(key)
    if hit is not None:
        return hit
    tu = _translation(gen, header, body)
    path = compiler.compile_kernel(tu, math_mode, label, sanitize=sanitize)
    compiled = _Compiled(runtime.load(path), tu)
    with _compiled_lock:
        _compiled[key] = compiled
    return compiled


def _input_views(inputs: Sequence[mx.array], ensure_row_contiguous: bool) -> list[np.ndarray]:
    views = []
    for arr in inputs:
        view = _numpy_view(arr)
        if ensure_row_contiguous or view.ndim == 0:
            view = np.ascontiguousarray(view)
        views.append(view)
    return views


def _buffer_table(
    params: Sequence[Param], views: Sequence[np.ndarray], outputs: Sequence[np.ndarray]
) -> tuple[ctypes.Array, list[np.ndarray]]:
    """The pointer table the launcher reads, and the arrays it points into (keep them)."""
    keep: list[np.ndarray] = []
    slots: dict[int, int] = {}
    output_index = 0
    for p in params:
        if p.kind == "attribute":
            continue
        if p.kind == "input":
            buf = views[p.input_index]
        elif p.kind == "shape":
            buf = np.array(views[p.input_index].shape, dtype=np.int32)
        elif p.kind == "strides":
            v = views[p.input_index]
            buf = np.array([s // v.itemsize for s in v.strides], dtype=np.int64)
        elif p.kind == "ndim":
            buf = np.array(views[p.input_index].ndim, dtype=np.int32)
        else:
            buf = outputs[output_index]
            output_index += 1
        keep.append(buf)
        slots[p.buffer_index] = buf.ctypes.data if buf.size else 0
    table = (ctypes.c_void_p * max(1, len(slots)))()
    for index, address in slots.items():
        table[index] = address
    return table, keep


# Libraries whose kernel turned out to block although its text looked barrier-free.
_blocking: set[Path] = set()


def run_body_kernel(
    gen: GeneratedSource,
    *,
    name: str,
    header: str,
    body: str,
    math_mode: str,
    inputs: Sequence[mx.array],
    ensure_row_contiguous: bool,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[mx.Dtype],
    grid: tuple[int, int, int],
    threadgroup: tuple[int, int, int],
    init_value: float | None,
    timeout: float | None,
    sanitize: bool = False,
) -> tuple[list[mx.array], SanitizerReport | None]:
    """Runs the kernel; with `sanitize`, also returns what the sanitizer found."""
    compiled = compile_body_kernel(gen, header, body, math_mode, name, sanitize)
    library = compiled.library
    views = _input_views(inputs, ensure_row_contiguous)
    clamped = tuple(min(t, g) for t, g in zip(threadgroup, grid))
    barrier_free = library.path not in _blocking and is_barrier_free(header, body)
    while True:
        outputs = [
            poisoned(dt, shape) if init_value is None else filled(dt, shape, init_value)
            for dt, shape in zip(output_dtypes, output_shapes)
        ]
        table, keep = _buffer_table(gen.params, views, outputs)
        sanitizing = _sanitizing(gen.params, keep, table) if sanitize else None
        try:
            runtime.dispatch(library, name, table, grid, clamped, timeout=timeout,
                             barrier_free=barrier_free, sanitizing=sanitizing)
        except runtime.NeedsFibers:
            # Blocking reached through a helper the text check cannot see: start again
            # with fresh outputs on the general path, and remember it for next time.
            _blocking.add(library.path)
            barrier_free = False
            continue
        except KernelFault as fault:
            if barrier_free and not isinstance(fault, KernelTimeout):
                # The fast path does not track which thread runs; fault again on the
                # general path to name it.
                barrier_free = False
                continue
            if sanitizing is None:
                raise
            report = _report(name, compiled, sanitizing, keep, gen.params, init_value,
                             finished=False)
            finding = _fault_finding(name, fault)
            if finding is not None and not report.of_kind(finding.kind):
                report.findings.append(finding)  # unless the runtime named it already
            return [], report
        report = None
        if sanitizing is not None:
            report = _report(name, compiled, sanitizing, keep, gen.params, init_value)
        return [_to_mx(out, dt) for out, dt in zip(outputs, output_dtypes)], report


def _sanitizing(params: Sequence[Param], buffers: Sequence[np.ndarray],
                table: ctypes.Array) -> runtime.Sanitizing:
    """Describes every buffer to the sanitizer, with a written-shadow for each output."""
    infos = (runtime.BufferInfo * (len(buffers) + 1))()
    shadows: list[np.ndarray] = []
    buffer_params = [p for p in params if p.kind != "attribute"]
    for info, p, buf in zip(infos, buffer_params, buffers):
        info.base = buf.ctypes.data
        info.size = buf.nbytes
        info.element_size = max(1, buf.itemsize)
        info.name = p.name.encode()
        if p.kind == "output":
            info.kind = runtime.BUFFER_OUTPUT
            shadow = np.zeros(buf.nbytes, dtype=np.uint8)
            shadows.append(shadow)
            info.written = shadow.ctypes.data
        else:
            info.kind = runtime.BUFFER_INPUT
    table_info = infos[len(buffers)]
    table_info.base = ctypes.addressof(table)
    table_info.size = ctypes.sizeof(table)
    table_info.element_size = 8
    table_info.kind = runtime.BUFFER_INTERNAL
    table_info.name = b"<buffer table>"
    return runtime.Sanitizing(infos, (runtime.Finding * 256)(), shadows=shadows)


def _source_line(compiled: _Compiled, frames: Sequence[tuple[str, int]]) -> str:
    """The author's line of the innermost inlined frame that lies in their code."""
    for file, line in frames:
        if not file.endswith("kernel.cpp"):
            continue
        for first, last, label, offset in compiled.translation.regions:
            if first <= line <= last:
                return f"{label}:{line - offset}"
    return ""


def _report(name: str, compiled: _Compiled, sanitizing: runtime.Sanitizing,
            buffers: Sequence[np.ndarray], params: Sequence[Param],
            init_value: float | None, finished: bool = True) -> SanitizerReport:
    lines = symbolize(compiled.library.path, [f.pc for f in sanitizing.found])
    buffer_names = [p.name for p in params if p.kind != "attribute"]
    report = SanitizerReport(name)
    for f in sanitizing.found:
        kind = SANITIZER_KINDS.get(f.kind, f"finding {f.kind}")
        where = ""
        if f.buffer >= 0:
            where = buffer_names[f.buffer] if f.buffer < len(buffer_names) else "<buffer table>"
        elif 0 <= f.tg_array < len(sanitizing.arrays):
            where = sanitizing.arrays[f.tg_array][0]
        located = lines.get(f.pc, [])
        report.findings.append(Finding(
            kind=kind,
            kernel=name,
            where=where,
            element=f.element if where else None,
            access=("write" if f.write else "read") if where else "",
            thread=tuple(f.thread),
            other_thread=tuple(f.other) if f.kind in (3, 5, 6) else None,
            other_access=("write" if f.other_write else "read") if f.kind == 3 else "",
            threadgroup=tuple(f.group),
            line=_source_line(compiled, located) if located else "",
            count=int(f.count),
        ))
    if init_value is None and finished:
        report.findings += _unwritten_outputs(name, params, buffers, sanitizing)
    return report


def _unwritten_outputs(name: str, params: Sequence[Param], buffers: Sequence[np.ndarray],
                       sanitizing: runtime.Sanitizing) -> list[Finding]:
    found = []
    outputs = [(p, b) for p, b in zip([p for p in params if p.kind != "attribute"], buffers)
               if p.kind == "output"]
    for (p, buf), shadow in zip(outputs, sanitizing.shadows):
        if not buf.size:
            continue
        per_element = shadow.reshape(buf.size, buf.itemsize).all(axis=1)
        missing = np.flatnonzero(~per_element)
        if missing.size:
            found.append(Finding(
                kind="output never written", kernel=name, where=p.name,
                element=int(missing[0]), access="write", count=int(missing.size),
                detail=f"{missing.size} of {buf.size} elements unwritten and no init_value",
            ))
    return found


def _fault_finding(name: str, fault: KernelFault) -> Finding | None:
    if "stopped by the sanitizer" in fault.detail:
        return None  # the finding that stopped it is in the report
    kinds = {ThreadgroupMemoryError: "threadgroup memory over budget",
             KernelDeadlock: "barrier divergence"}
    kind = next((k for cls, k in kinds.items() if isinstance(fault, cls)), "kernel fault")
    return Finding(kind=kind, kernel=name, detail=fault.detail)


def _to_mx(out: np.ndarray, dtype: mx.Dtype) -> mx.array:
    if dtype == mx.bfloat16:
        return mx.array(out).view(mx.bfloat16)
    return mx.array(out)
