"""Full-source kernels: whole ``[[kernel]]`` functions from ``.metal`` or header files.

    from mtwork.library import load_metal, new_buffer

    lib = load_metal("kernels/scale.metal")
    print(lib)                                        # its kernels, constants, host names
    k = lib.kernel("scale", template=(mx.float32,), constants={"use_bias": True})
    out = k(buffers={"x": x, "y": new_buffer(x.shape), "n": x.size},
            grid=(x.size,), threads_per_threadgroup=(256,))
    out["y"]                                          # numpy array

Buffers behave like Metal buffers in shared memory: a writable numpy array given for a
``device`` pointer is written in place, and every writable buffer comes back in the
returned `Outputs` (numpy, by parameter name; ``outputs.mx(name)`` for an ``mx.array``).
Read-only buffers and ``constant T&`` scalars may be numpy arrays, ``mx.array`` s or,
for scalars, Python numbers (converted to the declared type, with range checks); see
`mtwork.values`.

This module reads and binds; a call becomes a `Program` and a `Dispatch` that
`mtwork.backends.run` hands to a backend, as for body-form kernels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .backends import compile as compile_program
from .backends import get as get_backend
from .backends import run as run_program
from .buffers import to_mx
from .dispatch import Dispatch, FullSource, Param, Program, Sources, dims, geometry, options
from .errors import CompileError, ThreadgroupMemoryError
from .limits import (
    MAX_BUFFER_INDEX,
    MAX_THREADS_PER_THREADGROUP,
    THREADGROUP_MEMORY_ALIGNMENT,
    THREADGROUP_MEMORY_BYTES,
)
from .msl.body import MATH_MODES
from .msl.constants import function_constant_macros
from .msl.includes import included_files
from .msl.signature import (
    FunctionConstant,
    Instantiation,
    KernelParam,
    KernelSignature,
    parse_source,
)
from .msl.templates import literal, substitute, template_texts
from .msl.types import TypeInfo, type_info
from .sanitizer import SanitizerError, SanitizerReport
from .values import NewBuffer, bind, new_buffer, scalar_bytes

__all__ = ["Kernel", "Library", "NewBuffer", "Outputs", "load_metal", "new_buffer"]

_SOURCE_SUFFIXES = (".metal", ".h", ".hpp", ".hh", ".inc", ".msl")


def load_metal(
    source: str | os.PathLike,
    *,
    include_dirs: Sequence[str | os.PathLike] = (),
    prelude: str = "",
    math_mode: str = "safe",
    name: str | None = None,
    backend: str | None = None,
) -> Library:
    """Loads MSL from a ``.metal`` or header file, or from a string of source.

    ``#include "..."`` is resolved against the including file's folder, then
    `include_dirs`, then MLX's kernel headers (``"mlx/backend/metal/kernels/utils.h"``);
    ``<metal_stdlib>`` is mtwork's shim. `prelude` is placed before the source, as a
    ``.metal`` file that includes a header would (MLX's ``arange.metal`` includes
    ``utils.h`` before ``arange.h``). `math_mode` is ``"safe"`` (MLX's default),
    ``"relaxed"`` or ``"fast"``. The files are read now; load again to see later edits.
    """
    if math_mode not in MATH_MODES:
        raise ValueError(f"`math_mode` must be one of {', '.join(MATH_MODES)}, got "
                         f"{math_mode!r}")
    if not isinstance(prelude, str):
        raise TypeError(f"`prelude` must be MSL text (a str), got {type(prelude).__name__}")
    if isinstance(include_dirs, (str, os.PathLike)):
        raise TypeError("`include_dirs` must be a list of folders, got one path; wrap it "
                        "in a list")
    if backend is not None:
        get_backend(backend)
    path = _as_path(source)
    if path is None:
        text, label = str(source), name or "source"
    else:
        text, label = path.read_text(), name or str(path)
    dirs = tuple(Path(d).resolve() for d in include_dirs)
    return Library(text, path=path, label=label, include_dirs=dirs, prelude=prelude,
                   math_mode=math_mode, backend=backend)


def _as_path(source: str | os.PathLike) -> Path | None:
    """The file `source` names, or None when it is MSL text: a path object, or a string
    of one line ending in a source suffix (``.metal``, ``.h``, ...)."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"`source` must be MSL text or a path, got {type(source).__name__}")
    if isinstance(source, str) and ("\n" in source
                                    or not source.rstrip().endswith(_SOURCE_SUFFIXES)):
        return None
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no MSL file at {path}")
    return path.resolve()


class Library:
    """MSL source with its kernels, function constants and host-named instantiations.

    ``lib.kernel(name, template=..., constants=...)`` (or ``lib[name]``) gives a `Kernel`
    ready to dispatch; `name` is a kernel function or the host name of an explicit
    instantiation. Kernels defined in the user's included files are listed too.
    """

    def __init__(self, text: str, *, path: Path | None, label: str,
                 include_dirs: tuple[Path, ...], prelude: str, math_mode: str,
                 backend: str | None):
        self.text = text
        self.path = path
        self.label = label
        self.prelude = prelude
        self.math_mode = math_mode
        self.backend = backend
        self.include_dirs = include_dirs
        folder = path.parent if path else None
        self.search_dirs = ((folder,) if folder else ()) + include_dirs
        self.files = included_files(prelude + "\n" + text, folder, self.search_dirs)
        self.kernels: dict[str, KernelSignature] = {}
        self.function_constants: dict[str, FunctionConstant] = {}
        self.host_names: dict[str, Instantiation] = {}
        for file_label, file_text in [(label, text), *((str(p), t) for p, t in self.files.items())]:
            parsed = parse_source(file_text, file_label)
            for k in parsed.kernels:
                self.kernels.setdefault(k.name, k)
            for c in parsed.function_constants:
                self.function_constants.setdefault(c.name, c)
            for inst in parsed.instantiations:
                self.host_names.setdefault(inst.host_name, inst)

    @cached_property
    def sources(self) -> Sources:
        """The library's files as every program made from it carries them."""
        return Sources(self.text, self.label, self.path, tuple(self.files.items()),
                       self.search_dirs, self.prelude)

    def with_text(self, text: str) -> Library:
        """The same library with its main file's text replaced (an editor's buffer)."""
        return Library(text, path=self.path, label=self.label, include_dirs=self.include_dirs,
                       prelude=self.prelude, math_mode=self.math_mode, backend=self.backend)

    def names(self) -> list[str]:
        """Kernel functions, then host names of explicit instantiations."""
        return [*self.kernels, *self.host_names]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.kernels or name in self.host_names

    def __getitem__(self, name: str) -> Kernel:
        return self.kernel(name)

    def kernel(self, name: str, *, template: Any = None,
               constants: Mapping[str | int, Any] | None = None) -> Kernel:
        """The kernel `name`, instantiated with `template` and compiled with `constants`.

        `template`: values in the order of the template's parameters, or a mapping by
        parameter name; a type is an ``mx.Dtype``, a numpy dtype, ``float``/``int``/
        ``bool`` or Metal text (``"half4"``), a value an int or bool. `constants`: function
        constants by name or ``[[function_constant(index)]]``; those not given are not
        defined (``is_function_constant_defined`` is false) and read as zero.
        """
        if not isinstance(name, str):
            raise TypeError(f"a kernel's name is a str, got {type(name).__name__} {name!r}")
        instantiation = self.host_names.get(name)
        if instantiation is not None:
            if template is not None:
                raise CompileError(name, f"`{name}` is an explicit instantiation "
                                         f"({instantiation.function_text}); it takes no template")
            signature = self._signature(instantiation.function)
            args = template_texts(signature, list(instantiation.template_args), name)
            label = name
        else:
            signature = self._signature(name)
            args = template_texts(signature, template, name)
            label = signature.name + (f"<{', '.join(args)}>" if signature.is_template else "")
        return Kernel(self, signature, args, self._constant_values(constants), label)

    def _signature(self, name: str) -> KernelSignature:
        try:
            return self.kernels[name]
        except KeyError:
            raise UnknownKernelError(name, self) from None

    def _constant_values(self, given: Mapping[str | int, Any] | None) -> dict[str, str | None]:
        values: dict[str, str | None] = dict.fromkeys(self.function_constants)
        by_index = {c.index: c for c in self.function_constants.values()}
        for key, value in (given or {}).items():
            constant = (by_index.get(key) if isinstance(key, int) and not isinstance(key, bool)
                        else self.function_constants.get(key))  # type: ignore[arg-type]
            if constant is None:
                known = ", ".join(f"{c.name} [[function_constant({c.index})]]"
                                  for c in self.function_constants.values()) or "none"
                raise KeyError(f"{self.label} declares no function constant {key!r}; "
                               f"it declares: {known}")
            info = type_info(constant.type_text)
            if info is None or info.lanes != 1:
                raise TypeError(f"function constant `{constant.name}` has type "
                                f"{constant.type_text}; mtwork sets scalar constants only")
            bits = scalar_bytes(value, info, f"function constant `{constant.name}` "
                                             f"({constant.type_text})")
            values[constant.name] = literal(bits, info)
        return values

    def __repr__(self) -> str:
        lines = [f"Library({self.label!r}: {len(self.kernels)} kernels)"]
        for k in self.kernels.values():
            lines.append("  " + k.describe().replace("\n", "\n  "))
        if self.host_names:
            lines.append("  host names: " + ", ".join(
                f"{h} = {i.function_text}" for h, i in self.host_names.items()))
        if self.function_constants:
            lines.append("  function constants: " + ", ".join(
                f"{c.type_text} {c.name} [[function_constant({c.index})]]"
                for c in self.function_constants.values()))
        return "\n".join(lines)


class UnknownKernelError(KeyError):
    """`Library.kernel` was asked for a name the library does not define."""

    def __init__(self, name: str, library: Library):
        known = ", ".join(library.names()) or "none"
        self.message = f"{library.label} has no kernel `{name}`; it has: {known}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class Outputs(dict):
    """The kernel's writable buffers after a dispatch, as numpy arrays by parameter name
    (bfloat16 data as its uint16 bits). A numpy array the caller passed is the same
    object, written in place. ``outputs.mx(name)`` gives the buffer as an ``mx.array``."""

    def __init__(self, arrays: Mapping[str, np.ndarray], kinds: Mapping[str, mx.Dtype | None]):
        super().__init__(arrays)
        self._kinds = dict(kinds)

    def mx(self, name: str) -> mx.array:
        return to_mx(self[name], self._kinds.get(name))


def _describe(p: KernelParam) -> str:
    return f"{p.kind}({p.index}) `{p.name}` ({p.type_text})"


class Kernel:
    """One kernel of a `Library`, its template instantiated and its function constants
    set. Call it to dispatch; `compile()` compiles it ahead of time. The report of its
    last sanitized call is `last_sanitizer_report`."""

    def __init__(self, library: Library, signature: KernelSignature,
                 template_args: tuple[str, ...], constants: dict[str, str | None], label: str):
        self.library = library
        self.signature = signature
        self.template_args = template_args
        self.constants = constants
        self.name = label
        self.last_sanitizer_report: SanitizerReport | None = None
        unsupported = [p for p in signature.params if p.kind == "unsupported"]
        if unsupported:
            p = unsupported[0]
            raise TypeError(
                f"kernel `{signature.name}` has parameter `{p.name}` ({p.type_text}, "
                f"{p.attribute}); mtwork binds buffers, threadgroup memory and thread "
                f"attributes only")
        too_high = [p for p in signature.buffers if p.index is not None
                    and p.index > MAX_BUFFER_INDEX]
        if too_high:
            raise ValueError(f"{_describe(too_high[0])}: Metal has buffer indices 0 to "
                             f"{MAX_BUFFER_INDEX}")

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
            form=FullSource(self.signature, self.template_args, constants),
            defines=function_constant_macros({n: (t, v) for n, t, v in constants}),
            max_threads=min(MAX_THREADS_PER_THREADGROUP,
                            self.signature.max_threads or MAX_THREADS_PER_THREADGROUP),
        )

    # -- binding ---------------------------------------------------------------------

    def _bind(self, buffers: Mapping[int | str, Any] | Sequence[Any] | None
              ) -> dict[str, tuple[KernelParam, Any]]:
        params = self.signature.buffers
        if buffers is None:
            buffers = {}
        if isinstance(buffers, (str, bytes, np.ndarray, mx.array)):
            raise TypeError("`buffers` maps [[buffer(n)]] indices or parameter names to "
                            f"values (or is a list by index), got {type(buffers).__name__}")
        if not isinstance(buffers, Mapping):
            buffers = dict(enumerate(buffers))
        by_index = {p.index: p for p in params}
        by_name = {p.name: p for p in params}
        chosen: dict[str, tuple[KernelParam, Any]] = {}
        for key, value in buffers.items():
            if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                p = by_index.get(int(key))
            elif isinstance(key, str):
                p = by_name.get(key)
            else:
                raise TypeError(f"buffers are bound by index (int) or name (str), not {key!r}")
            if p is None:
                raise TypeError(self._no_such_buffer(key))
            if p.name in chosen:
                raise TypeError(f"{_describe(p)} is bound twice (by index and by name)")
            chosen[p.name] = (p, value)
        missing = [p for p in params if p.name not in chosen and self.is_present(p)]
        if missing:
            raise TypeError(f"kernel `{self.name}`: no binding for "
                            + ", ".join(_describe(p) for p in missing))
        return chosen

    def _no_such_buffer(self, key: int | str) -> str:
        other = next((p for p in self.signature.params if p.name == key), None)
        if other is not None and other.kind == "threadgroup":
            return (f"`{key}` is threadgroup memory: give its size in bytes with "
                    f"threadgroup_memory={{{other.index}: ...}}")
        if other is not None and other.kind == "attribute":
            return f"`{key}` is the thread attribute [[{other.attribute}]]: the dispatch sets it"
        what = f"buffer({key})" if isinstance(key, int) else f"buffer named `{key}`"
        have = ", ".join(_describe(p) for p in self.signature.buffers) or "none"
        return f"kernel `{self.name}` has no {what}; its buffers are: {have}"

    def _threadgroup_sizes(self, sizes: Mapping[int | str, int] | None) -> dict[int, int]:
        """Bytes of each ``[[threadgroup(n)]]`` argument, by index in increasing order."""
        params = self.signature.threadgroup_params
        if sizes is not None and not isinstance(sizes, Mapping):
            raise TypeError("`threadgroup_memory` maps [[threadgroup(n)]] indices or names "
                            f"to sizes in bytes, got {type(sizes).__name__}")
        given: dict[int, int] = {}
        for key, size in (sizes or {}).items():
            p = None if isinstance(key, bool) else next(
                (q for q in params if key in (q.index, q.name)), None)
            if p is None:
                have = ", ".join(_describe(q) for q in params) or "none"
                raise TypeError(f"kernel `{self.name}` has no threadgroup({key}) argument; "
                                f"it has: {have}")
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
                raise ValueError(f"{_describe(p)}: the size is a number of bytes (0 or more), "
                                 f"got {size!r}")
            if size % THREADGROUP_MEMORY_ALIGNMENT:
                raise ValueError(f"{_describe(p)}: {size} bytes is not a multiple of 16, as "
                                 f"Metal's setThreadgroupMemoryLength requires")
            given[p.index] = int(size)  # type: ignore[index]
        missing = [p for p in params if p.index not in given]
        if missing:
            raise TypeError(f"kernel `{self.name}`: give the size in bytes of "
                            + ", ".join(_describe(p) for p in missing)
                            + " with threadgroup_memory={index: bytes}")
        total = sum(given.values())
        if total > THREADGROUP_MEMORY_BYTES:
            raise ThreadgroupMemoryError(
                self.name, f"its [[threadgroup(n)]] arguments take {total} bytes, more than "
                           f"the {THREADGROUP_MEMORY_BYTES} bytes (32 KiB) a threadgroup has")
        return dict(sorted(given.items()))

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
    ) -> Dispatch:
        """The dispatch record of a call (see `__call__`), every argument checked."""
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
        chosen = self._bind(buffers)
        bound = {p.index: bind(p, value, self.element_info(p),
                               f"{_describe(p)} of `{self.name}`")
                 for p, value in chosen.values()}
        return Dispatch(bound, shape, options(sanitize=sanitize, timeout=timeout),
                        self._threadgroup_sizes(threadgroup_memory))

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
    ) -> Outputs:
        """Dispatches the kernel and returns its writable buffers.

        `buffers`: by ``[[buffer(n)]]`` index or parameter name (a sequence binds indices
        0, 1, ...). `threadgroup_memory`: bytes for each ``[[threadgroup(n)]]`` argument.
        Give `threadgroups` (``dispatchThreadgroups``: how many threadgroups) or `grid`
        (``dispatchThreads``: how many threads; edge threadgroups are partial), and
        `threads_per_threadgroup`. `timeout`: the sim watchdog, in seconds. `sanitize`:
        True or "warn" runs on sim with every access checked (see mtwork.sanitizer).
        """
        call = self.dispatch(buffers=buffers, threadgroup_memory=threadgroup_memory,
                             threadgroups=threadgroups, grid=grid,
                             threads_per_threadgroup=threads_per_threadgroup,
                             timeout=timeout, sanitize=sanitize)
        try:
            done = run_program(self.program, call, backend=backend or self.library.backend)
        except SanitizerError as exc:
            self.last_sanitizer_report = exc.report
            raise
        self.last_sanitizer_report = done.sanitizer
        by_index = {p.index: p for p in self.signature.buffers}
        arrays = {by_index[i].name: arr for i, arr in done.buffers.items()}
        kinds = {by_index[i].name: getattr(call.buffers[i], "dtype", None) for i in done.buffers}
        return Outputs(arrays, kinds)

    def compile(self, *, backend: str | None = None, sanitize: bool | str | None = None
                ) -> Kernel:
        """Compiles the kernel now where the backend compiles ahead of a call (sim; a
        `CompileError` quotes the author's files and lines). Returns the kernel."""
        compile_program(self.program, backend=backend or self.library.backend,
                         options=options(sanitize=sanitize))
        return self
