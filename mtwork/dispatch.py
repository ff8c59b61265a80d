"""What every backend receives: a `Program` to compile and a `Dispatch` to run it with.

Both kernel forms meet here. `mtwork.metal_kernel` (MLX's body form) and
`mtwork.load_metal` (whole ``[[kernel]]`` functions) each describe their kernel as a
`Program` — its MSL sources, the function to call and its parameters in order — and each
call as a `Dispatch` — the memory bound to each ``[[buffer(n)]]``, the threadgroup memory,
the geometry, and options such as the sanitizer and the watchdog. `mtwork.backends.run`
hands both to a backend, which returns a `Completion`.

The checks every dispatch passes (geometry, options) live here too, with one set of
messages for both forms.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import mlx.core as mx
import numpy as np

from . import host
from .display import bytes_text
from .dtypes import itemsize
from .limits import MAX_GRID_DIMENSION, MAX_THREADS_PER_THREADGROUP
from .msl.signature import KernelSignature
from .msl.target import DEFAULT_MSL_TARGET, MslTarget
from .recording import profiling_all

if TYPE_CHECKING:
    from .gpu.counters import Counters
    from .kernel_log import KernelLog
    from .sanitizer import SanitizerReport

__all__ = [
    "BodyForm",
    "Bound",
    "Completion",
    "Dispatch",
    "Engine",
    "Fresh",
    "FullSource",
    "Geometry",
    "Options",
    "Param",
    "Program",
    "Region",
    "Sources",
    "available_memory",
    "backend_for",
    "check_memory",
    "geometry",
    "options",
]

SanitizeMode = Literal["raise", "warn", "report"]

# --- the program -----------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter of the kernel function, in declaration order, as the host binds it.

    `derived` marks a buffer the backend fills itself from another buffer: MLX's body
    form passes ``inp_shape``/``inp_strides``/``inp_ndim`` of an input; it holds the kind
    and the input's buffer index.
    """

    kind: Literal["buffer", "threadgroup", "attribute"]
    name: str
    type_text: str  # as declared, template arguments substituted
    index: int | None = None  # [[buffer(n)]] or [[threadgroup(n)]]
    attribute: str = ""  # the thread attribute, for kind "attribute"
    writable: bool = False
    derived: tuple[Literal["shape", "strides", "ndim"], int] | None = None


@dataclass(frozen=True)
class Region:
    """Lines `first`..`last` of a program's main file are lines of the author's `name`,
    counted from `offset` + 1."""

    first: int
    last: int
    name: str
    offset: int

    def locate(self, line: int) -> int | None:
        """The author's line number for `line`, or None when it is not in this region."""
        return line - self.offset if self.first <= line <= self.last else None


@dataclass(frozen=True)
class Sources:
    """A program's MSL as its author wrote it.

    `text` is the main file; `files` the author's files it includes (with their text, read
    when the kernel was loaded); `search_dirs` where its ``#include "..."`` look;
    `prelude` what comes before it (MLX's body form puts its ``utils.h`` there). Compiler
    messages name `label` and the files' paths, or `regions` where they are given.
    """

    text: str
    label: str
    path: Path | None = None
    files: tuple[tuple[Path, str], ...] = ()
    search_dirs: tuple[Path, ...] = ()
    prelude: str = ""
    regions: tuple[Region, ...] = ()

    def author_line(self, line: int) -> tuple[str, int] | None:
        """(name, line) of the author's text at `line` of the main file."""
        if not self.regions:
            return self.label, line
        for region in self.regions:
            at = region.locate(line)
            if at is not None:
                return region.name, at
        return None


@dataclass(frozen=True)
class BodyForm:
    """The ``mx.fast.metal_kernel`` kernel and call a body-form program came from."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    source: str
    header: str
    ensure_row_contiguous: bool
    atomic_outputs: bool
    compile_options: tuple[tuple[str, Any], ...] | None
    template: tuple[tuple[str, Any], ...] | None


@dataclass(frozen=True)
class FullSource:
    """A full-source kernel: its signature, template arguments (as text) and function
    constant values (name, type, value text or None when not set); `instantiated`: the
    source instantiates it itself (a host name)."""

    signature: KernelSignature
    template_args: tuple[str, ...]
    constants: tuple[tuple[str, str, str | None], ...]
    instantiated: bool = False


@dataclass(frozen=True)
class Program:
    """One kernel function to compile: its sources, the function to call (with template
    arguments), its parameters, the math mode and the `defines` (preprocessor lines that
    come first: function-constant values). `form` is what the kernel was written as;
    `msl_target` the language version and GPU family it is checked and compiled for."""

    label: str
    sources: Sources
    function: str
    params: tuple[Param, ...]
    math_mode: str
    form: BodyForm | FullSource
    defines: str = ""
    max_threads: int = MAX_THREADS_PER_THREADGROUP
    msl_target: MslTarget = DEFAULT_MSL_TARGET

    def param(self, index: int) -> Param:
        """The buffer parameter bound to ``[[buffer(index)]]``."""
        return next(p for p in self.params if p.kind == "buffer" and p.index == index)


# --- the dispatch ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """Memory the caller gives for one buffer. A writable numpy array is written in place;
    an ``mx.array`` is never changed (its writes come back in the `Completion`).
    `contiguous`: the kernel sees the data row-contiguous (else with its own strides)."""

    array: np.ndarray | mx.array
    dtype: mx.Dtype | None = None  # the element type, where known (bfloat16 data as uint16)
    writable: bool = False
    contiguous: bool = True


@dataclass(frozen=True)
class Fresh:
    """Memory the dispatch makes for one buffer: `shape` elements of `dtype`, filled with
    `fill`, or else with a poison pattern so that elements never written show up."""

    shape: tuple[int, ...]
    dtype: mx.Dtype
    fill: float | int | None = None


@dataclass(frozen=True)
class Geometry:
    """Threads in the grid and threads per threadgroup (edge threadgroups may be partial)."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]

    @property
    def threads_per_threadgroup(self) -> int:
        return math.prod(self.threadgroup)

    @property
    def threadgroups(self) -> tuple[int, int, int]:
        g, t = self.grid, self.threadgroup
        return (-(-g[0] // t[0]), -(-g[1] // t[1]), -(-g[2] // t[2]))


@dataclass(frozen=True)
class Options:
    """How to run: `sanitize` ("raise", "warn", "report" or None), `timeout` (seconds of the sim
    watchdog, None for the default), `isolate` (sim: in a worker process, so that a
    crashing kernel cannot take the caller down; None for $MTWORK_ISOLATE's choice),
    `profile` (count what the dispatch does to an Apple GPU: `Completion.counters`),
    `log` (the kernel's `os_log` messages: None records them where the backend can, sim;
    True runs the call on sim to record them; False leaves them out: logging calls do
    nothing)."""

    sanitize: SanitizeMode | None = None
    timeout: float | None = None
    isolate: bool | None = None
    profile: bool = False
    log: bool | None = None


@dataclass(frozen=True)
class Dispatch:
    """One call: memory by ``[[buffer(n)]]`` index, bytes by ``[[threadgroup(n)]]`` index,
    the geometry and the options. `unbound`: buffers the call leaves unbound, as Metal
    allows where the kernel never reads them (reading one is an error naming it). `into`:
    memory the caller has for some fresh buffers (the outputs MLX made for an operation of
    its graph), by index; a backend may write them there and return them, else the caller
    copies them in. `stream`: the MLX stream or device the call was given, where its
    operation of MLX's graph runs."""

    buffers: Mapping[int, Bound | Fresh]
    geometry: Geometry
    options: Options = Options()
    threadgroup_memory: Mapping[int, int] = field(default_factory=dict)
    unbound: tuple[int, ...] = ()
    into: Mapping[int, np.ndarray] = field(default_factory=dict)
    stream: Any = None  # the MLX stream or device the call was given (`stream=`)


@dataclass(frozen=True)
class Engine:
    """Which of the emulator's engines ran a dispatch (sim: "fast", "fibers" or "loops",
    the plain loops of a kernel that never blocks) and, when not the fast one, why."""

    name: str
    reason: str | None = None

    def __str__(self) -> str:
        return self.name if self.reason is None else f"{self.name} ({self.reason})"


@dataclass
class Completion:
    """What a dispatch gave: each written buffer (fresh and writable ones, numpy or mx by
    backend), the sanitizer's report when it ran, the threadgroup memory used (sim), the
    engine that ran it (sim), the profiler's counts when it ran, the kernel's log when the
    backend recorded one (sim)."""

    buffers: dict[int, np.ndarray | mx.array]
    sanitizer: SanitizerReport | None = None
    threadgroup_memory: int | None = None
    engine: Engine | None = None
    counters: Counters | None = None
    log: KernelLog | None = None


# --- checks ----------------------------------------------------------------------------


def _is_count(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0


def dims(value: Any, what: str, *, exactly_three: bool, prefix: str = "") -> tuple[int, int, int]:
    """`value` as (x, y, z) positive integers: three of them, or one to three (the rest 1)."""
    items: tuple[Any, ...]
    if _is_count(value) and not exactly_three:
        items = (value,)
    else:
        try:
            items = tuple(value)
        except TypeError:
            items = ()
    arity = len(items) == 3 if exactly_three else 1 <= len(items) <= 3
    if not arity or not all(_is_count(v) for v in items):
        allowed = ("three positive integers (x, y, z)" if exactly_three
                   else "one to three positive integers (x[, y[, z]])")
        raise ValueError(f"{prefix}`{what}` must be {allowed}, got {value!r}")
    padded = [int(v) for v in items] + [1] * (3 - len(items))
    for axis, v in zip("xyz", padded):
        if v > MAX_GRID_DIMENSION:
            raise ValueError(f"{prefix}`{what}` {axis} = {v} is more than Metal dispatches: "
                             f"each dimension holds 1 to {MAX_GRID_DIMENSION} (2**32 - 1)")
    return padded[0], padded[1], padded[2]


def geometry(grid: Any, threadgroup: Any, *, exactly_three: bool, max_threads: int,
             grid_name: str = "grid", threadgroup_name: str = "threadgroup",
             prefix: str = "") -> Geometry:
    """Checks a dispatch's shape: `grid` threads in all, `threadgroup` threads per group,
    no more than `max_threads` in a group (Metal's 1024, or the kernel's own limit)."""
    tg = dims(threadgroup, threadgroup_name, exactly_three=exactly_three, prefix=prefix)
    threads = math.prod(tg)
    if threads > max_threads:
        raise ValueError(
            f"{prefix}`{threadgroup_name}` {tg} has {threads} threads, more than the "
            f"{max_threads} a threadgroup of this kernel may have; make it smaller")
    return Geometry(dims(grid, grid_name, exactly_three=exactly_three, prefix=prefix), tg)


def check_timeout(value: Any, what: str = "`timeout`") -> float | None:
    """`value` as seconds: None (the default), or a positive finite number."""
    if value is None:
        return None
    allowed = "a positive, finite number of seconds"
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be {allowed}, got {value!r} ({type(value).__name__})")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must be {allowed}, got {value!r}")
    return seconds


def env_timeout() -> float | None:
    """$MTWORK_TIMEOUT in seconds, checked; None when it is not set."""
    value = os.environ.get("MTWORK_TIMEOUT")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"MTWORK_TIMEOUT must be a positive, finite number of seconds, "
                         f"got {value!r}")
    return seconds


def options(*, sanitize: Any = None, timeout: Any = None, isolate: Any = None,
            profile: Any = False, log: Any = None) -> Options:
    """Checked `Options`; `sanitize` True/"raise", "warn", "report", False/None, or from
    $MTWORK_SANITIZE when None; `profile` True or False; `log` True, False or None."""
    from .sanitizer import mode

    if isolate is not None and not isinstance(isolate, bool):
        raise ValueError(f"`isolate` must be True, False or None, got {isolate!r}")
    if log is not None and not isinstance(log, bool):
        raise ValueError(f"`log` must be True (record the kernel's os_log messages, on sim), "
                         f"False (logging calls do nothing) or None (record them where the "
                         f"backend can), got {log!r}")
    if not isinstance(profile, bool):
        raise ValueError(f"`profile` must be True or False, got {profile!r}")
    if profiling_all() and sanitize is None:
        profile = True  # inside `recording.profiling_calls`
    # A profiled call leaves $MTWORK_SANITIZE aside; asked for both, it refuses.
    checked = None if profile and sanitize is None else mode(sanitize)
    if profile and checked is not None:
        raise ValueError("`profile=True` and `sanitize` cannot be combined: each builds the "
                         "kernel with its own instrumentation; run the call once with each")
    return Options(sanitize=checked, timeout=check_timeout(timeout), isolate=isolate,
                   profile=profile, log=log)


def backend_for(call_options: Options, backend: str | None) -> str | None:
    """The backend a call runs on: a profiled call runs on ``sim``, whose emulator counts
    what the kernel does (on a Mac too, as a sanitized call does), and so does a call with
    ``log=True``, whose emulator records the kernel's messages; others on `backend`."""
    return "sim" if call_options.profile or call_options.log else backend


_MEMORY_READ_EVERY_S = 1.0
_memory_read: list[float] = [-math.inf, 0.0]  # when, and the bytes available then


def available_memory(*, fresh: bool = False) -> float:
    """Bytes of memory this machine can still give a process (`host.available_memory`).
    Read at most once a second unless `fresh`."""
    when, value = _memory_read
    now = time.monotonic()
    if fresh or now - when > _MEMORY_READ_EVERY_S:
        value = host.available_memory()
        _memory_read[:] = [now, value]
    return value


def check_memory(call: Dispatch, what: str) -> None:
    """Refuses a call whose buffers (the new ones `what` asks for, and the inputs, which
    a worker process holds a copy of) do not fit in the memory available: a kernel run
    on more memory than there is gets its process killed by the system."""
    new = sum(math.prod(b.shape) * itemsize(b.dtype) for b in call.buffers.values()
              if isinstance(b, Fresh))
    given = sum(b.array.nbytes for b in call.buffers.values() if isinstance(b, Bound))
    if new + given <= available_memory() or new + given <= available_memory(fresh=True):
        return
    raise ValueError(f"{what} asks for {new:,} bytes ({bytes_text(new)}) of new buffers, "
                     f"and the inputs take {given:,} bytes ({bytes_text(given)}): more than "
                     f"the {available_memory():,.0f} bytes ({bytes_text(available_memory())}) "
                     f"of memory this machine has available; make the outputs smaller or "
                     f"split the work into several calls")
