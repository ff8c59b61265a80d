"""One kernel of a full-source library: its template instantiated, its function constants
set, its buffers bound, dispatched through `mtwork.backends.run`; and `LibraryLaunch`,
one call of it with everything it needs (what a sweep's or an editor's `build` returns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import mlx.core as mx
import numpy as np

from .backends import chosen, hold, log_note
from .backends import compile as compile_program
from .backends import run as run_program
from .buffers import to_mx
from .dispatch import (
    Completion,
    Dispatch,
    Engine,
    FullSource,
    Param,
    Program,
    Sources,
    backend_for,
    check_memory,
    dims,
    geometry,
    options,
)
from .errors import KernelFault, MetalRuleError
from .gpu.counters import Counters
from .kernel_log import KernelLog, announce, kept
from .library_arguments import chosen_buffers, describe, threadgroup_sizes
from .library_operation import (
    check_kept,
    is_operation,
    operation_outputs,
    stream_of,
    traced_call,
    weakly,
)
from .limits import MAX_THREADS_PER_THREADGROUP
from .msl.constants import function_constant_macros
from .msl.rules import signature_violations
from .msl.signature import FunctionConstant, KernelParam, KernelSignature
from .msl.target import MslTarget
from .msl.templates import substitute
from .msl.types import TypeInfo, type_info
from .sanitizer import SanitizerError, SanitizerReport
from .values import bind


class LibraryParts(Protocol):
    """What a kernel reads of the library it comes from (a `mtwork.library.Library`)."""

    sources: Sources
    math_mode: str
    backend: str | None
    defines: Mapping[str, str]
    function_constants: Mapping[str, FunctionConstant]
    target: MslTarget
    constant_names: frozenset[str]

__all__ = ["Kernel", "LibraryLaunch", "LibraryParts", "Outputs"]


class Outputs(dict):
    """The kernel's writable buffers after a dispatch, as numpy arrays by parameter name
    (bfloat16 data as its uint16 bits). A numpy array the caller passed is the same
    object, written in place. ``outputs.mx(name)`` gives the buffer as an ``mx.array``.
    A call traced inside ``mx.compile`` or another transformation of MLX is an operation
    of MLX's graph: its outputs are ``mx.array``s of the graph, computed when MLX
    evaluates them."""

    def __init__(self, arrays: Mapping[str, np.ndarray | mx.array],
                 kinds: Mapping[str, mx.Dtype | None]):
        super().__init__(arrays)
        self._kinds = dict(kinds)

    def mx(self, name: str) -> mx.array:
        return to_mx(self[name], self._kinds.get(name))


class Kernel:
    """One kernel of a `Library`, its template instantiated and its function constants
    set. Call it to dispatch; `compile()` compiles it ahead of time. The report of its
    last sanitized call is `last_sanitizer_report`, the counts of its last profiled call
    `last_counters`; the emulator's engine that ran its last call (and, when not the fast
    one, why) `last_engine`; the `os_log` messages of its last call `last_log` (see
    mtwork.kernel_log)."""

    def __init__(self, library: LibraryParts, signature: KernelSignature,
                 template_args: tuple[str, ...], constants: dict[str, str | None], label: str,
                 instantiated: bool = False):
        self.library = library
        self.signature = signature
        self.template_args = template_args
        self.instantiated = instantiated  # by the source itself (a host name)
        self.constants = constants
        self.name = label
        self.last_sanitizer_report: SanitizerReport | None = None
        self.last_engine: Engine | None = None
        self.last_counters: Counters | None = None
        self.last_log: KernelLog | None = None
        self._log_note = ""  # why its last call ran on sim (log=True)
        hold(self)  # the emulator's worker lives while a kernel does
        broken = tuple(signature_violations(signature, library.target,
                                            library.constant_names))
        if broken:
            raise MetalRuleError(label, broken)
        unsupported = [p for p in signature.params if p.kind == "unsupported"]
        if unsupported:
            p = unsupported[0]
            raise TypeError(
                f"kernel `{signature.name}` has parameter `{p.name}` ({p.type_text}, "
                f"{p.attribute}); mtwork binds buffers, threadgroup memory and thread "
                f"attributes only")

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})\n{self.signature.describe()}"

    @property
    def function(self) -> str:
        """The C++ function the dispatch calls, e.g. ``scale<float>``."""
        if not self.signature.is_template:
            return self.signature.name
        return f"{self.signature.name}<{', '.join(self.template_args)}>"

    @property
    def template_values(self) -> dict[str, str]:
        """Every template parameter's argument, defaults included (``{"T": "float"}``)."""
        values: dict[str, str] = {}
        for k, param in enumerate(self.signature.template_params):
            given = k < len(self.template_args)
            values[param.name] = (self.template_args[k] if given
                                  else substitute(param.default or "", values))
        return values

    def param_type(self, p: KernelParam) -> str:
        """`p`'s declared type with the template arguments in place."""
        return substitute(p.type_text, self.template_values)

    def element_info(self, p: KernelParam) -> TypeInfo | None:
        """What `p` points at (or refers to), when it is a scalar or vector type."""
        return self._element_infos[p.name]

    @cached_property
    def _element_infos(self) -> dict[str, TypeInfo | None]:
        return {
            p.name: type_info(KernelParam(p.name, self.param_type(p), p.kind).element_type)
            for p in self.signature.params
        }

    def is_present(self, p: KernelParam) -> bool | None:
        """Whether a ``[[function_constant(c)]]`` parameter exists in this compilation:
        True/False when `c` is a function constant, None when it cannot be told here."""
        gate = p.function_constant
        if gate is None:
            return True
        if gate not in self.constants:
            return None
        return self.constants[gate] not in (None, "false", "0")

    @cached_property
    def program(self) -> Program:
        """What the backends compile for this kernel."""
        lib = self.library
        params = tuple(
            Param(p.kind, p.name, self.param_type(p), p.index,  # type: ignore[arg-type]
                  attribute=p.attribute if p.kind == "attribute" else "",
                  writable=p.writable)
            for p in self.signature.params
        )
        constants = tuple((name, c.type_text, self.constants.get(name))
                          for name, c in lib.function_constants.items())
        return Program(
            label=self.name,
            sources=lib.sources,
            function=self.function,
            params=params,
            math_mode=lib.math_mode,
            form=FullSource(self.signature, self.template_args, constants, self.instantiated),
            defines="".join(f"#define {name} {value}\n" for name, value in lib.defines.items())
            + function_constant_macros({n: (t, v) for n, t, v in constants}),
            max_threads=min(lib.target.limits.threads_per_threadgroup,
                            self.signature.max_threads or MAX_THREADS_PER_THREADGROUP),
            msl_target=lib.target,
        )

    # -- binding ---------------------------------------------------------------------

    def unbound(self, chosen: Mapping[str, Any]) -> tuple[int, ...]:
        """The indices of the kernel's buffers a call leaves unbound (Metal runs a kernel
        with buffers it never reads unbound; reading one stops the call with an error
        naming it)."""
        return tuple(p.index for p in self.signature.buffers  # type: ignore[misc]
                     if p.name not in chosen and self.is_present(p) is not False)

    def dispatch(
        self,
        *,
        buffers: Mapping[int | str, Any] | Sequence[Any] | None = None,
        threadgroup_memory: Mapping[int | str, int] | None = None,
        threadgroups: Any = None,
        grid: Any = None,
        threads_per_threadgroup: Any = None,
        timeout: float | None = None,
        sanitize: bool | str | None = None,
        isolate: bool | None = None,
        profile: bool = False,
        log: bool | None = None,
        keep_arrays: bool = False,
        stream: Any = None,
    ) -> Dispatch:
        """The dispatch record of a call (see `__call__`), every argument checked;
        `keep_arrays`: ``mx.array`` buffers are bound as they are (see `values.bind`)."""
        stream = stream_of(self.name, stream)
        if (threadgroups is None) == (grid is None):
            raise TypeError("give either threadgroups= (dispatchThreadgroups: a count of "
                            "threadgroups) or grid= (dispatchThreads: a count of threads)")
        if threads_per_threadgroup is None:
            raise TypeError("threads_per_threadgroup= is required")
        tg = dims(threads_per_threadgroup, "threads_per_threadgroup", exactly_three=False)
        grid_name = "grid"
        if grid is None:
            groups = dims(threadgroups, "threadgroups", exactly_three=False)
            grid = tuple(g * t for g, t in zip(groups, tg))
            grid_name = "threadgroups × threads_per_threadgroup"
        shape = geometry(grid, tg, exactly_three=False, max_threads=self.program.max_threads,
                         grid_name=grid_name, threadgroup_name="threads_per_threadgroup")
        picked = chosen_buffers(self.name, self.signature, buffers)
        bound = {p.index: bind(p, value, self.element_info(p),
                               f"{describe(p)} of `{self.name}`", keep_arrays=keep_arrays)
                 for p, value in picked.values()}
        if keep_arrays:
            check_kept(self.name, bound)
        # One mx array at several indices stays one buffer (its copy is shared), as a
        # numpy array does: one MTLBuffer bound twice has one address.
        copies: dict[int, Any] = {}
        for p, value in picked.values():
            if isinstance(value, mx.array) and not keep_arrays:
                first = copies.setdefault(id(value), bound[p.index].array)  # type: ignore
                bound[p.index] = dataclasses.replace(bound[p.index], array=first)  # type: ignore
        call = Dispatch(bound, shape, options(sanitize=sanitize, timeout=timeout,
                                              isolate=isolate, profile=profile, log=log),
                        threadgroup_sizes(self.name, self.signature.threadgroup_params,
                                          threadgroup_memory,
                                          self.library.target.limits.threadgroup_memory),
                        self.unbound(picked), stream=stream)
        check_memory(call, f"`{self.name}`'s new_buffer arguments")
        return call

    def __call__(
        self,
        *,
        buffers: Mapping[int | str, Any] | Sequence[Any] | None = None,
        threadgroup_memory: Mapping[int | str, int] | None = None,
        threadgroups: Any = None,
        grid: Any = None,
        threads_per_threadgroup: Any = None,
        backend: str | None = None,
        timeout: float | None = None,
        sanitize: bool | str | None = None,
        isolate: bool | None = None,
        profile: bool = False,
        log: bool | None = None,
        stream: Any = None,
    ) -> Outputs:
        """Dispatches the kernel and returns its writable buffers.

        `buffers`: by ``[[buffer(n)]]`` index or parameter name (a sequence binds indices
        0, 1, ...); one array given at several indices is one buffer with one address, as
        one ``MTLBuffer`` bound twice. A buffer the kernel never reads may be left unbound,
        as on Metal; on sim, reading an unbound one raises a TypeError naming it.
        `threadgroup_memory`: bytes for each ``[[threadgroup(n)]]`` argument.
        Give `threadgroups` (``dispatchThreadgroups``: how many threadgroups) or `grid`
        (``dispatchThreads``: how many threads; edge threadgroups are partial), and
        `threads_per_threadgroup`. `timeout`: the sim watchdog, in seconds. `sanitize`:
        True or "warn" runs on sim with every access checked (see mtwork.sanitizer).
        `isolate`: sim runs kernels in a worker process (False: in this one). `profile`:
        True runs on sim and counts what the call does to an Apple GPU
        (`last_counters`; see mtwork.profile). `log`: the kernel's `os_log` messages
        (`last_log`), recorded on sim by default; True runs the call on sim to record them,
        False leaves them out (see mtwork.kernel_log). `stream`: as
        ``mx.fast.metal_kernel``'s; a call given one is an operation of MLX's graph on it
        (`mtwork.library_operation`: its outputs are computed when MLX evaluates them,
        ``mx.async_eval`` included).
        """
        lazy = is_operation(buffers, stream)
        call = self.dispatch(buffers=buffers, threadgroup_memory=threadgroup_memory,
                             threadgroups=threadgroups, grid=grid,
                             threads_per_threadgroup=threads_per_threadgroup,
                             timeout=timeout, sanitize=sanitize, isolate=isolate,
                             profile=profile, log=log, keep_arrays=lazy, stream=stream)
        asked = backend or self.library.backend
        name = backend_for(call.options, asked)
        self._log_note = log_note(call.options, asked)
        if lazy:
            written = operation_outputs(self.program, call, chosen(name, call.options),
                                        weakly(self._finish), traced=traced_call(buffers))
        else:
            try:
                done = run_program(self.program, call, backend=name)
            except KernelFault as exc:
                self._finish(None, exc)
                raise
            self._finish(done, None)
            written = done.buffers
        by_index = {p.index: p for p in self.signature.buffers}
        arrays = {by_index[i].name: arr for i, arr in written.items()}
        kinds = {by_index[i].name: getattr(call.buffers[i], "dtype", None) for i in written}
        return Outputs(arrays, kinds)

    def _finish(self, done: Completion | None, error: BaseException | None) -> None:
        """What a dispatch tells the kernel when it ends (report, engine, counts, log,
        printed too: `kernel_log.announce`)."""
        self.last_log = kept(done.log if done is not None else None, error, self._log_note)
        announce(self.last_log)
        if isinstance(error, SanitizerError):
            self.last_sanitizer_report = error.report
        if done is None:
            return
        self.last_sanitizer_report = done.sanitizer
        self.last_engine = done.engine
        if done.counters is not None:
            self.last_counters = done.counters

    def compile(self, *, backend: str | None = None, sanitize: bool | str | None = None,
                profile: bool = False) -> Kernel:
        """Compiles the kernel now where the backend compiles ahead of a call (sim; its
        profiled build with `profile`; a `CompileError` quotes the author's files and
        lines). Returns the kernel."""
        compile_program(self.program, backend=backend or self.library.backend,
                         options=options(sanitize=sanitize, profile=profile))
        return self

    def launch(self, **call: Any) -> LibraryLaunch:
        """One call of this kernel, kept to run later: the arguments `__call__` takes
        (buffers, geometry, threadgroup memory, timeout), checked now."""
        unknown = set(call) - _CALL_ARGUMENTS
        if unknown:
            raise TypeError(f"launch() takes {', '.join(sorted(_CALL_ARGUMENTS))}; not "
                            f"{', '.join(sorted(unknown))}")
        self.dispatch(**{k: v for k, v in call.items()})
        return LibraryLaunch(self, call)


_CALL_ARGUMENTS = frozenset({"buffers", "threadgroup_memory", "threadgroups", "grid",
                             "threads_per_threadgroup", "timeout", "isolate"})


@dataclass(frozen=True)
class LibraryLaunch:
    """One call of a full-source `Kernel` (see `Kernel.launch`). Calling it dispatches:
    ``launch(backend=..., sanitize=...)`` returns the kernel's `Outputs`. A numpy array
    among the buffers is written in place on every call."""

    kernel: Kernel
    call: Mapping[str, Any] = field(default_factory=dict)

    define_line_count = 0  # full-source kernels take constants, not defines

    def replace_kernel(self, kernel: Kernel) -> LibraryLaunch:
        """This launch with another kernel (an edited one) in it."""
        return dataclasses.replace(self, kernel=kernel)

    def compile(self, *inputs: Any, backend: str | None = None, profile: bool = False
                ) -> None:
        """Compiles the kernel ahead of a call (full-source kernels take no inputs here):
        its profiled build with `profile`."""
        self.kernel.compile(backend=backend, profile=profile)

    @property
    def sanitizer_report(self) -> SanitizerReport | None:
        """The sanitizer's report of this launch's last sanitized call."""
        return self.kernel.last_sanitizer_report

    def __call__(self, *inputs: Any, backend: str | None = None,
                 sanitize: bool | str | None = None, profile: bool = False,
                 log: bool | None = None) -> Outputs:
        if inputs:
            raise TypeError("a full-source launch carries its buffers; call it without "
                            "inputs")
        return self.kernel(**self.call, backend=backend, sanitize=sanitize, profile=profile,
                           log=log)

    @property
    def last_log(self) -> KernelLog | None:
        """The messages of this launch's kernel's last call (see `Kernel.last_log`)."""
        return self.kernel.last_log

    @property
    def last_counters(self) -> Counters | None:
        """The counts of this launch's kernel's last profiled call."""
        return self.kernel.last_counters
