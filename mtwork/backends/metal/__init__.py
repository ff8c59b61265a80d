"""The `metal` backend: the Apple GPU, through ``mx.fast.metal_kernel``.

A body-form program is handed to MLX exactly as its author wrote it, and its outputs are
MLX's, evaluated when MLX evaluates them. A full-source
program is first written as a body-form kernel (`mtwork.msl.wrap`): its buffers travel
as MLX inputs (fresh copies), and what the kernel writes is copied back afterwards.

Each program's ``mx.fast.metal_kernel`` object is made once and kept (MLX builds the
pipeline at its first dispatch and keeps it by the kernel's name and source). A dispatch
is prepared (`prepare`: the kernel object, the inputs as MLX arrays, the host copies a
full-source kernel needs) apart from the dispatch itself, so that timing can dispatch a
prepared call many times with no host work between (`mtwork.batched`).

What this relies on in MLX's Python API (0.32): ``mx.fast.metal_kernel(name=,
input_names=, output_names=, source=, header=, ensure_row_contiguous=, atomic_outputs=,
compile_options={"math_mode": ...})``; calling the kernel object with the keyword-only
``inputs=, output_shapes=, output_dtypes=, grid=, threadgroup=, template=, init_value=``,
which returns a list of lazy arrays; ``mx.eval``; ``mx.metal.is_available`` (MLX's own
functions, not interposed ones: `mtwork.native`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ...buffers import allocate, numpy_view, to_mx
from ...dispatch import BodyForm, Completion, Dispatch, Fresh, FullSource, Program
from ...msl.includes import inline_includes
from ...msl.wrap import MetalWrapper, input_name, wrap
from ...native import metal_available, metal_kernel

__all__ = ["MetalBackend", "Prepared", "wrapper"]

# Kernel objects kept: one per program (and, for a full-source program, per set of bound
# buffers and threadgroup memory sizes, which its wrapper depends on).
KERNELS_KEPT = 256


def wrapper(program: Program, bound: Sequence[str], threadgroup_bytes: Mapping[int, int],
            aliases: Mapping[str, str] | None = None) -> MetalWrapper:
    """The ``mx.fast.metal_kernel`` arguments that run full-source `program` with the
    buffers named in `bound`, ``[[threadgroup(n)]]`` sizes `threadgroup_bytes`, and
    `aliases` (a buffer bound to the same memory as an earlier one, by name)."""
    if not isinstance(program.form, FullSource):
        raise TypeError(f"`{program.label}` is a body-form kernel: MLX runs it as it is")
    src = program.sources
    flat = inline_includes(src.prelude + "\n" + src.text,
                           src.path.parent if src.path else None, src.search_dirs)
    form = program.form
    return wrap(form.signature, form.template_args, program.defines, flat, bound=bound,
                threadgroup_bytes=threadgroup_bytes, aliases=aliases)


def _aliases(memory: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Buffers given the same memory as an earlier one (one MTLBuffer bound at several
    indices), each mapped to that earlier buffer's name."""
    first: dict[tuple[int, int], str] = {}
    aliases = {}
    for name, view in memory.items():
        key = (view.ctypes.data, view.nbytes)
        if view.nbytes and key in first:
            aliases[name] = first[key]
        else:
            first.setdefault(key, name)
    return aliases


@dataclass
class Prepared:
    """One call made ready: `dispatch()` hands MLX the kernel and its arguments (a lazy
    dispatch; nothing is copied), `finish(results)` turns what it returned into the
    call's `Completion` (copying back what a full-source kernel wrote)."""

    kernel: Any
    arguments: dict[str, Any]
    finish: Callable[[list[mx.array]], Completion]

    def dispatch(self) -> list[mx.array]:
        return self.kernel(**self.arguments)

    def materialize(self) -> None:
        """Evaluates the inputs (an input may be a lazy array of MLX's graph), so that a
        timed dispatch computes only itself."""
        mx.eval(self.arguments["inputs"])


class MetalBackend:
    """The Apple GPU through MLX. `make_kernel` is what builds a body-form kernel
    (MLX's own ``mx.fast.metal_kernel``, not an interposed one; a test may pass
    ``mtwork.metal_kernel`` bound to another backend, to run exactly what this backend
    would hand MLX)."""

    name = "metal"
    builds_graph = True  # mx.fast.metal_kernel's outputs are arrays of MLX's graph

    def __init__(self, make_kernel: Callable[..., Any] | None = None):
        self._make_kernel = make_kernel or metal_kernel
        self._kernels: OrderedDict[Any, Any] = OrderedDict()

    def unavailable_reason(self) -> str | None:
        if metal_available():
            return None
        return ("no Metal device: MLX reports mx.metal.is_available() == False "
                "(not an Apple GPU)")

    def compile(self, program: Program, *, sanitize: bool = False) -> None:
        """MLX compiles a kernel at its first dispatch: nothing to do ahead of it."""

    def cancel(self) -> None:
        """A command buffer MLX has committed runs to its end: nothing can stop it."""

    def dispatch(self, program: Program, call: Dispatch) -> Completion:
        prepared = self.prepare(program, call)
        return prepared.finish(prepared.dispatch())

    def prepare(self, program: Program, call: Dispatch) -> Prepared:
        """Everything `call` needs but the dispatch: the kernel object (made once per
        program), the inputs as MLX arrays, the buffers a full-source kernel carries."""
        if isinstance(program.form, BodyForm):
            return self._body(program, program.form, call)
        return self._full_source(program, program.form, call)

    def _kept(self, key: Any, make: Callable[[], Any]) -> Any:
        """What is kept for `key` (the last KERNELS_KEPT used), made by `make` at first."""
        found = self._kernels.get(key)
        if found is None:
            found = self._kernels[key] = make()
            if len(self._kernels) > KERNELS_KEPT:
                self._kernels.popitem(last=False)
        else:
            self._kernels.move_to_end(key)
        return found

    def _body(self, program: Program, form: BodyForm, call: Dispatch) -> Prepared:
        options = {} if form.compile_options is None else {
            "compile_options": dict(form.compile_options)}
        kernel = self._kept(program, lambda: self._make_kernel(
            name=form.name, input_names=list(form.input_names),
            output_names=list(form.output_names), source=form.source, header=form.header,
            ensure_row_contiguous=form.ensure_row_contiguous,
            atomic_outputs=form.atomic_outputs, **options))
        buffers = [p for p in program.params if p.kind == "buffer" and p.derived is None]
        inputs = [call.buffers[p.index] for p in buffers if not p.writable]
        outputs = [(p.index, call.buffers[p.index]) for p in buffers if p.writable]
        fills = {o.fill for _, o in outputs if isinstance(o, Fresh)}
        arguments = dict(
            inputs=[to_mx(b.array, b.dtype) for b in inputs],  # type: ignore[union-attr]
            output_shapes=[o.shape for _, o in outputs],  # type: ignore[union-attr]
            output_dtypes=[o.dtype for _, o in outputs],  # type: ignore[union-attr]
            grid=call.geometry.grid, threadgroup=call.geometry.threadgroup,
            template=list(form.template) if form.template else None,
            init_value=next(iter(fills)) if fills else None, stream=call.stream)

        def finish(results: list[mx.array]) -> Completion:
            return Completion({index: out for (index, _), out in zip(outputs, results)})

        return Prepared(kernel, arguments, finish)

    def _full_source(self, program: Program, form: FullSource, call: Dispatch) -> Prepared:
        bound = {p.name: p for p in form.signature.buffers if p.index in call.buffers}
        memory = {}
        for p in bound.values():
            buf = call.buffers[p.index]  # type: ignore[index]
            memory[p.name] = (allocate(buf.dtype, buf.shape, buf.fill)
                              if isinstance(buf, Fresh) else numpy_view(buf.array))
        aliases = _aliases(memory)
        key = (program, tuple(bound), tuple(sorted(call.threadgroup_memory.items())),
               tuple(sorted(aliases.items())))

        def make() -> tuple[MetalWrapper, Any]:
            wrapped = wrapper(program, list(bound), call.threadgroup_memory, aliases)
            return wrapped, self._make_kernel(
                name=wrapped.name, input_names=wrapped.input_names,
                output_names=wrapped.output_names, source=wrapped.source,
                header=wrapped.header, ensure_row_contiguous=False,
                compile_options={"math_mode": program.math_mode})

        wrapped, kernel = self._kept(key, make)
        carriers = {}
        for name in wrapped.input_names:
            p = next(q for q in bound.values() if input_name(q) == name)
            flat_bytes = memory[p.name].reshape(-1).view(np.uint8)
            padded = np.zeros(max(flat_bytes.size, 8), dtype=np.uint8)
            padded[: flat_bytes.size] = flat_bytes
            carriers[p.name] = mx.array(padded)
        inputs = [(p, carriers[aliases.get(p.name, p.name)]) for p in bound.values()]
        arguments = dict(inputs=list(carriers.values()), output_shapes=[(1,)],
                         output_dtypes=[mx.float32], grid=call.geometry.grid,
                         threadgroup=call.geometry.threadgroup, stream=call.stream)

        def finish(results: list[mx.array]) -> Completion:
            mx.eval(results)
            # The kernel wrote into its inputs' memory: copy the writable ones back.
            written = {}
            for p, arr in inputs:
                buf = call.buffers[p.index]  # type: ignore[index]
                if isinstance(buf, Fresh) or buf.writable:
                    target = memory[p.name]
                    raw = np.array(arr)[: target.nbytes]
                    np.copyto(target.reshape(-1).view(np.uint8), raw)
                    written[p.index] = target
            return Completion(written)

        return Prepared(kernel, arguments, finish)
