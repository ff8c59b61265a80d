"""`mtwork.metal_kernel`: a drop-in for `mx.fast.metal_kernel` that runs on any backend,
and `Launch`, one call of such a kernel with everything it needs.

A call generates the MSL MLX would compile (`mtwork.msl.body`), describes it as a
`Program` and the call as a `Dispatch`, and hands both to `mtwork.backends.run`.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import mlx.core as mx

from . import dtypes, graph
from .backends import builds_graph, chosen, hold, log_note
from .backends import compile as compile_program
from .backends import get as get_backend
from .backends import run as run_program
from .buffers import to_mx
from .dispatch import (
    BodyForm,
    Bound,
    Completion,
    Dispatch,
    Engine,
    Fresh,
    Options,
    Param,
    Program,
    Region,
    Sources,
    backend_for,
    check_memory,
    geometry,
    options,
)
from .errors import KernelFault
from .gpu.counters import Counters
from .kernel_arguments import (
    PREFIX,
    check_flag,
    check_init_value,
    check_kernel_name,
    check_names,
    check_output_dtypes,
    check_output_shapes,
    check_sequence,
    check_stream,
    check_text,
    define_lines,
)
from .kernel_log import KernelLog, announce, kept
from .msl import body, checks
from .msl.target import MslTarget, resolve_target
from .sanitizer import SanitizerError, SanitizerReport

__all__ = ["Launch", "MetalKernel", "define_lines", "metal_kernel"]

def _param(p: body.Param, inputs: Sequence[body.Param]) -> Param:
    """A generated parameter as the dispatch record describes it."""
    if p.kind == "attribute":
        return Param("attribute", p.name, p.msl_type, attribute=p.name)
    if p.kind == "output":
        element = f"atomic<{p.msl_type}>" if p.atomic else p.msl_type
        return Param("buffer", p.name, f"device {element}*", p.buffer_index, writable=True)
    ref = "&" if p.by_reference else "*"
    type_text = f"const {p.address_space} {p.msl_type}{ref}"
    if p.kind == "input":
        return Param("buffer", p.name, type_text, p.buffer_index)
    source = next(q.buffer_index for q in inputs if q.input_index == p.input_index)
    return Param("buffer", p.name, type_text, p.buffer_index,
                 derived=(p.kind, source))  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class MetalKernel:
    """A kernel in MLX's body form. Call it as you would call `mx.fast.metal_kernel`'s
    result; extras: `backend=` ('metal' or 'sim'), `timeout=` (seconds, sim only),
    `sanitize=` (True or 'warn': run on sim with every access checked, see
    mtwork.sanitizer), `isolate=` (sim: False runs the kernel in this process, not in
    the worker process that keeps a crashing kernel from taking the caller down) and
    `profile=` (True: run on sim and count what the call does to an Apple GPU, see
    mtwork.profile), `log=` (the kernel's `os_log` messages: recorded on sim by default;
    True runs the call on sim to record them; False leaves them out; see
    mtwork.kernel_log). `msl_version=` and `gpu_family=` say what the kernel is checked and
    compiled for on sim (default $MTWORK_MSL_VERSION or "3.2", $MTWORK_GPU_FAMILY or
    "apple7"; see mtwork.msl.target). The kernel does not change; `last_sanitizer_report`
    keeps the report of its last sanitized call, `last_counters` the counts of its last
    profiled one, `last_engine` which engine of the emulator ran its last call (and, when
    not the fast one, why), `last_log` the messages of its last call (set when MLX evaluates
    it; None where no log was kept)."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    source: str
    header: str = ""
    ensure_row_contiguous: bool = True
    atomic_outputs: bool = False
    compile_options: Mapping[str, Any] | None = None
    backend: str | None = None
    msl_version: str | None = None
    gpu_family: str | None = None
    last_sanitizer_report: SanitizerReport | None = field(default=None, compare=False,
                                                          repr=False)
    last_engine: Engine | None = field(default=None, compare=False, repr=False)
    last_counters: Counters | None = field(default=None, compare=False, repr=False)
    last_log: KernelLog | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_kernel_name(self.name)
        object.__setattr__(self, "input_names", check_names(self.input_names, "input_names"))
        object.__setattr__(self, "output_names", check_names(self.output_names,
                                                             "output_names"))
        both = set(self.input_names) & set(self.output_names)
        if both:
            raise ValueError(f"{PREFIX}{sorted(both)} named twice: as an input and as an "
                             f"output (the kernel's parameters need names of their own)")
        checks.check_has_outputs(self.output_names)
        check_text(self.source, "source")
        check_text(self.header, "header")
        for flag in ("ensure_row_contiguous", "atomic_outputs"):
            check_flag(getattr(self, flag), flag)
        checks.validate_compile_options(self.compile_options)
        if self.backend is not None:
            get_backend(self.backend)
        resolve_target(self.msl_version, self.gpu_family)  # refuses a wrong one now
        hold(self)  # the emulator's worker lives while a kernel does

    def with_texts(self, *, source: str | None = None, header: str | None = None
                   ) -> MetalKernel:
        """The same kernel with its body or header text replaced."""
        return dataclasses.replace(
            self, source=self.source if source is None else source,
            header=self.header if header is None else header, last_sanitizer_report=None,
            last_engine=None, last_counters=None, last_log=None)

    @property
    def math_mode(self) -> str:
        return checks.validate_compile_options(self.compile_options)

    @property
    def target(self) -> MslTarget:
        """The MSL version and GPU family the kernel is checked and compiled for."""
        return resolve_target(self.msl_version, self.gpu_family)

    def __repr__(self) -> str:
        return (f"MetalKernel({self.name!r}, inputs={list(self.input_names)}, "
                f"outputs={list(self.output_names)})")

    def generate(self, inputs: Sequence[Any], output_dtypes: Sequence[mx.Dtype],
                 template: Any = None) -> body.GeneratedSource:
        """The MSL MLX would compile for these inputs (what `verbose=True` prints)."""
        arrays = [dtypes.as_mx_array(x) for x in inputs]
        return body.generate(
            self.name, self.input_names, self.output_names, self.source, header=self.header,
            atomic_outputs=self.atomic_outputs, template=template,
            inputs=[body.InputInfo.of(a) for a in arrays], output_dtypes=list(output_dtypes))

    def program(self, gen: body.GeneratedSource, template: Any = None) -> Program:
        """The program the backends compile for one generated source."""
        inputs = gen.params_of("input")
        regions = [Region(gen.body_line, gen.body_line + gen.body_lines - 1, "source",
                          gen.body_line - 1)]
        if gen.header_lines:
            regions.insert(0, Region(1, gen.header_lines, "header", 0))
        options = None if self.compile_options is None else tuple(self.compile_options.items())
        form = BodyForm(self.name, self.input_names, self.output_names, self.source,
                        self.header, self.ensure_row_contiguous, self.atomic_outputs, options,
                        tuple(checks.validate_template(template)) or None)
        return Program(
            label=self.name,
            sources=Sources(gen.text, "<generated>", prelude=body.PRELUDE,
                            regions=tuple(regions)),
            function=gen.function,
            params=tuple(_param(p, inputs) for p in gen.params),
            math_mode=self.math_mode,
            form=form,
            msl_target=self.target,
        )

    def compile(self, inputs: Sequence[Any], output_dtypes: Sequence[mx.Dtype],
                template: Any = None, *, backend: str | None = None,
                sanitize: bool | str | None = None, profile: bool = False) -> None:
        """Compiles the kernel for these inputs now, where the backend compiles ahead of
        a call (sim; its profiled build with `profile`); a `CompileError` quotes the
        author's lines."""
        arrays = [dtypes.as_mx_array(x) for x in inputs]  # as a call generates it
        program = self.program(self.generate(arrays, output_dtypes, template), template)
        compile_program(program, backend=backend or self.backend,
                         options=options(sanitize=sanitize, profile=profile))

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
        isolate: bool | None = None,
        profile: bool = False,
        log: bool | None = None,
    ) -> list[mx.array]:
        inputs = check_sequence(inputs, "inputs")
        output_shapes = check_sequence(output_shapes, "output_shapes")
        output_dtypes = check_sequence(output_dtypes, "output_dtypes")
        checks.check_call_sizes(self.input_names, self.output_names, inputs, output_shapes,
                              output_dtypes)
        shape = geometry(grid, threadgroup, exactly_three=True,
                         max_threads=self.target.limits.threads_per_threadgroup, prefix=PREFIX)
        shapes, kinds = check_output_shapes(output_shapes), check_output_dtypes(output_dtypes)
        stream = check_stream(stream)
        check_init_value(init_value)
        check_flag(verbose, "verbose")
        run_options = options(sanitize=sanitize, timeout=timeout, isolate=isolate,
                              profile=profile, log=log)
        arrays = [dtypes.as_mx_array(x) for x in inputs]
        gen = self.generate(arrays, kinds, template)
        if verbose:
            print(gen.verbose_text(), end="")
        checks.check_gpu_dtypes([a.dtype for a in arrays], kinds)
        program = self.program(gen, template)
        buffers: dict[int, Bound | Fresh] = {}
        for p, arr in zip(gen.params_of("input"), arrays):
            buffers[p.buffer_index] = Bound(arr, arr.dtype,  # type: ignore[index]
                                            contiguous=self.ensure_row_contiguous)
        outputs = gen.params_of("output")
        for p, shape_, dt in zip(outputs, shapes, kinds):
            buffers[p.buffer_index] = Fresh(shape_, dt, init_value)  # type: ignore[index]
        call = Dispatch(buffers, shape, run_options, stream=stream)
        check_memory(call, f"{PREFIX}`output_shapes`")
        asked = backend or self.backend
        name = chosen(backend_for(run_options, asked), run_options)
        note = log_note(run_options, asked)
        if not builds_graph(name):
            if graph.available():
                return self._operation(program, call, name, arrays, outputs, note)
            graph.warn_eager()
        finish = self._finisher(run_options, note)
        try:
            done = run_program(program, call, backend=name)
        except KernelFault as exc:
            finish(None, exc)
            raise
        finish(done, None)
        return [to_mx(done.buffers[p.buffer_index], dt)  # type: ignore[index]
                for p, dt in zip(outputs, kinds)]

    def _operation(self, program: Program, call: Dispatch, backend: str,
                   arrays: list[mx.array], outputs: list[body.Param], note: str
                   ) -> list[mx.array]:
        """The call as an operation of MLX's graph, run on `backend` when MLX evaluates
        it; compiled now (compiling needs no values, and its errors come at the call).
        A sanitized or profiled call is evaluated at once unless it is being traced, so
        that its report or counts are there when it returns."""
        compile_program(program, backend=backend, options=call.options)
        made = graph.operation(program, call, backend, self._finisher(call.options, note))
        results = [made[p.buffer_index] for p in outputs]  # type: ignore[index]
        if (call.options.sanitize or call.options.profile) and not any(
                graph.is_tracer(a) for a in arrays):
            mx.eval(results)
        return results

    def _finisher(self, run_options: Options, note: str = "") -> graph.Finish:
        """What a dispatch of this kernel tells it when it ends: the sanitizer's report,
        the engine, the profiler's counts, the log (printed too: `kernel_log.announce`;
        `note` says why it ran on sim). It holds the kernel weakly: an operation MLX keeps
        (in a compiled function) does not keep the kernel, or its worker, alive."""
        kernel = weakref.ref(self)

        def finish(done: Completion | None, error: BaseException | None) -> None:
            this = kernel()
            if this is None:
                return
            log = kept(done.log if done is not None else None, error, note)
            object.__setattr__(this, "last_log", log)
            announce(log)
            if isinstance(error, SanitizerError):
                object.__setattr__(this, "last_sanitizer_report", error.report)
            if done is None:
                return
            object.__setattr__(this, "last_sanitizer_report", done.sanitizer)
            object.__setattr__(this, "last_engine", done.engine)
            if run_options.profile:
                object.__setattr__(this, "last_counters", done.counters)

        return finish


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
    msl_version: str | None = None,
    gpu_family: str | None = None,
) -> MetalKernel:
    """Same arguments as `mx.fast.metal_kernel`; the result runs on `metal` or `sim`.
    `msl_version` ("3.1", "3.2", "4.0", ...) and `gpu_family` ("apple7" to "apple10")
    set what `sim` holds the kernel to (the language version's rules and predefined
    macros, the family's limits)."""
    return MetalKernel(name, input_names, output_names, source, header, ensure_row_contiguous,
                       atomic_outputs, compile_options, backend, msl_version, gpu_family)


# --- one call of a kernel ------------------------------------------------------------------


@dataclass
class Launch:
    """One call of an `mtwork.metal_kernel`, with its template values, `#define`d
    constants and dispatch shape. Calling it runs the kernel (its outputs are evaluated
    before it returns): `launch(*inputs, backend=...)`; without inputs it uses `inputs`
    given here.

    `defines` become `#define NAME value` lines at the top of the header, so the kernel
    body and header can use them as constants (on `metal` as on `sim`). Header lines in
    compiler messages are then shifted by the number of defines; body lines are not.
    """

    kernel: MetalKernel
    grid: Sequence[int]
    threadgroup: Sequence[int]
    output_shapes: Sequence[Sequence[int]]
    output_dtypes: Sequence[mx.Dtype]
    inputs: Sequence[Any] | None = None
    template: Sequence[tuple[str, Any]] | None = None
    defines: Mapping[str, Any] | None = None
    init_value: float | None = None
    timeout: float | None = None

    @cached_property
    def defined_kernel(self) -> MetalKernel:
        """The kernel with `defines` written into its header."""
        if not self.defines:
            return self.kernel
        return self.kernel.with_texts(header=define_lines(self.defines) + self.kernel.header)

    def replace_kernel(self, kernel: MetalKernel) -> Launch:
        """This launch with another kernel (an edited one) in it."""
        return dataclasses.replace(self, kernel=kernel)

    @property
    def define_line_count(self) -> int:
        """How many lines the defines add above the header."""
        return len(self.defines or {})

    def compile(self, *inputs: Any, backend: str | None = None, profile: bool = False
                ) -> None:
        """Compiles the kernel for these inputs (or the launch's own) ahead of a call: its
        profiled build with `profile`."""
        arrays = list(inputs) if inputs else list(self.inputs or [])
        self.defined_kernel.compile(arrays, self.output_dtypes, self.template, backend=backend,
                                    profile=profile)

    @property
    def sanitizer_report(self) -> SanitizerReport | None:
        """The sanitizer's report of this launch's last sanitized call."""
        return self.defined_kernel.last_sanitizer_report

    def __call__(self, *inputs: Any, backend: str | None = None,
                 sanitize: bool | str | None = None, profile: bool = False,
                 log: bool | None = None) -> list[mx.array]:
        arrays = list(inputs) if inputs else list(self.inputs or [])
        outputs = self.defined_kernel(
            inputs=arrays, grid=self.grid, threadgroup=self.threadgroup,
            output_shapes=self.output_shapes, output_dtypes=self.output_dtypes,
            template=self.template, init_value=self.init_value, backend=backend,
            timeout=self.timeout, sanitize=sanitize, profile=profile, log=log,
        )
        mx.eval(outputs)  # a launch runs when called: its errors and reports come here
        return outputs

    @property
    def last_counters(self) -> Counters | None:
        """The counts of this launch's last profiled call."""
        return self.defined_kernel.last_counters

    @property
    def last_log(self) -> KernelLog | None:
        """The messages of this launch's last call (see `MetalKernel.last_log`)."""
        return self.defined_kernel.last_log
