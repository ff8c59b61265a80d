"""`mtwork.metal_kernel`: a drop-in for `mx.fast.metal_kernel` that runs on any backend."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from . import dtypes, sanitizer, source
from .backends import metal as metal_backend
from .backends import resolve as resolve_backend
from .limits import MAX_THREADS_PER_THREADGROUP


def _three_positive_ints(value: Any, what: str) -> tuple[int, int, int]:
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    ok = len(items) == 3 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items
    )
    if not ok:
        raise ValueError(
            f"[metal_kernel] `{what}` must be three positive integers (x, y, z), got {value!r}"
        )
    return items  # type: ignore[return-value]


def _check_outputs(
    output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence[Any]
) -> tuple[list[tuple[int, ...]], list[mx.Dtype]]:
    shapes = []
    for i, shape in enumerate(output_shapes):
        try:
            dims = tuple(int(d) for d in shape)
        except TypeError:
            raise ValueError(
                f"[metal_kernel] output_shapes[{i}] must be a sequence of ints, got {shape!r}"
            ) from None
        if any(d < 0 for d in dims):
            raise ValueError(f"[metal_kernel] output_shapes[{i}] has a negative size: {shape!r}")
        shapes.append(dims)
    kinds = []
    for i, dt in enumerate(output_dtypes):
        if not isinstance(dt, mx.Dtype):
            raise ValueError(
                f"[metal_kernel] output_dtypes[{i}] must be an mlx dtype such as mx.float32, "
                f"got {dt!r}"
            )
        dtypes.type_string(dt)
        kinds.append(dt)
    return shapes, kinds


def _check_stream(stream: Any) -> None:
    if stream is None:
        return
    device = getattr(stream, "device", stream)
    kind = getattr(device, "type", device)
    if kind != mx.gpu:
        raise ValueError("[metal_kernel] Only supports the GPU.")


class MetalKernel:
    """A kernel in MLX's body form. Call it as you would call `mx.fast.metal_kernel`'s
    result; extras: `backend=` ('metal' or 'sim'), `timeout=` (seconds, sim only) and
    `sanitize=` (True or 'warn': run on sim with every access checked, see
    mtwork.sanitizer)."""

    def __init__(
        self,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
        ensure_row_contiguous: bool = True,
        atomic_outputs: bool = False,
        compile_options: dict[str, Any] | None = None,
        *,
        backend: str | None = None,
    ):
        from .source import check_has_outputs, validate_compile_options

        check_has_outputs(output_names)
        self.math_mode = validate_compile_options(compile_options)
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self.atomic_outputs = atomic_outputs
        self.compile_options = compile_options
        self.backend = backend
        self.last_sanitizer_report: sanitizer.SanitizerReport | None = None

    def __repr__(self) -> str:
        return (
            f"MetalKernel({self.name!r}, inputs={self.input_names}, "
            f"outputs={self.output_names})"
        )

    def generate(
        self, inputs: Sequence[Any], output_dtypes: Sequence[mx.Dtype], template: Any = None
    ) -> source.GeneratedSource:
        """The MSL MLX would compile for these inputs (what `verbose=True` prints)."""
        arrays = [dtypes.as_mx_array(x) for x in inputs]
        return source.generate(
            self.name,
            self.input_names,
            self.output_names,
            self.source,
            header=self.header,
            atomic_outputs=self.atomic_outputs,
            template=template,
            inputs=[source.InputInfo.of(a) for a in arrays],
            output_dtypes=list(output_dtypes),
        )

    def __call__(
        self,
        *,
        inputs: Sequence[Any],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
        grid: Sequence[int],
        threadgroup: Sequence[int],
        template: Sequence[tuple[str, Any]] | None = None,
        init_value: float | None = None,
        verbose: bool = False,
        stream: Any = None,
        backend: str | None = None,
        timeout: float | None = None,
        sanitize: bool | str | None = None,
    ) -> list[mx.array]:
        source.check_call_sizes(
            self.input_names, self.output_names, inputs, output_shapes, output_dtypes
        )
        grid3 = _three_positive_ints(grid, "grid")
        tg3 = _three_positive_ints(threadgroup, "threadgroup")
        threads = tg3[0] * tg3[1] * tg3[2]
        if threads > MAX_THREADS_PER_THREADGROUP:
            raise ValueError(
                f"[metal_kernel] threadgroup {tg3} has {threads} threads, more than the "
                f"{MAX_THREADS_PER_THREADGROUP} a threadgroup may have; make it smaller"
            )
        shapes, kinds = _check_outputs(output_shapes, output_dtypes)
        _check_stream(stream)
        arrays = [dtypes.as_mx_array(x) for x in inputs]
        gen = self.generate(arrays, kinds, template)
        if verbose:
            print(gen.verbose_text(), end="")
        source.check_gpu_dtypes([a.dtype for a in arrays], kinds)
        sanitizer_mode = sanitizer.mode(sanitize)
        # The sanitizer is the emulator's: a sanitized run happens on sim.
        chosen = resolve_backend("sim" if sanitizer_mode else (backend or self.backend))
        if chosen == "metal":
            call = dict(inputs=arrays, output_shapes=shapes, output_dtypes=kinds, grid=grid3,
                        threadgroup=tg3, template=template, init_value=init_value)
            return metal_backend.run_body_kernel(
                name=self.name, input_names=self.input_names, output_names=self.output_names,
                source=self.source, header=self.header,
                ensure_row_contiguous=self.ensure_row_contiguous,
                atomic_outputs=self.atomic_outputs, compile_options=self.compile_options,
                call=call,
            )
        from .backends import sim

        outputs, report = sim.run_body_kernel(
            gen, name=self.name, header=self.header, body=self.source,
            math_mode=self.math_mode, inputs=arrays,
            ensure_row_contiguous=self.ensure_row_contiguous, output_shapes=shapes,
            output_dtypes=kinds, grid=grid3, threadgroup=tg3, init_value=init_value,
            timeout=timeout, sanitize=sanitizer_mode is not None,
        )
        self.last_sanitizer_report = report
        if report is not None and not report.ok:
            if sanitizer_mode == "raise" or not outputs:
                raise sanitizer.SanitizerError(report)
            warnings.warn(str(report), sanitizer.SanitizerWarning, stacklevel=2)
        return outputs


def metal_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    atomic_outputs: bool = False,
    compile_options: dict[str, Any] | None = None,
    *,
    backend: str | None = None,
) -> MetalKernel:
    """Same arguments as `mx.fast.metal_kernel`; the result runs on `metal` or `sim`."""
    return MetalKernel(
        name, input_names, output_names, source, header, ensure_row_contiguous,
        atomic_outputs, compile_options, backend=backend,
    )
