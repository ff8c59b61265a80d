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

from .backends import get as get_backend
from .dispatch import Sources
from .errors import CompileError, MetalRuleError
from .library_kernel import Kernel, LibraryLaunch, Outputs
from .msl.checks import MATH_MODES
from .msl.includes import included_files
from .msl.lexing import code_without_directives, line_of
from .msl.preprocess import preprocess
from .msl.rules import Violation
from .msl.rules.kernels import kernel_return_message, non_void_kernels
from .msl.rules.scope import constant_names
from .msl.signature import FunctionConstant, Instantiation, KernelSignature, parse_source
from .msl.target import DEFAULT_MSL_TARGET, MslTarget, resolve_target
from .msl.templates import literal, template_texts
from .msl.types import type_info
from .values import NewBuffer, new_buffer, scalar_bytes

__all__ = ["Kernel", "Library", "LibraryLaunch", "NewBuffer", "Outputs", "load_metal",
           "new_buffer"]

_SOURCE_SUFFIXES = (".metal", ".h", ".hpp", ".hh", ".inc", ".msl")


def load_metal(
    source: str | os.PathLike,
    *,
    include_dirs: Sequence[str | os.PathLike] = (),
    prelude: str = "",
    defines: Mapping[str, Any] | None = None,
    math_mode: str = "safe",
    name: str | None = None,
    backend: str | None = None,
    msl_version: str | None = None,
    gpu_family: str | None = None,
) -> Library:
    """Loads MSL from a ``.metal`` or header file, or from a string of source.

    ``#include "..."`` is resolved against the including file's folder, then
    `include_dirs`, then MLX's kernel headers (``"mlx/backend/metal/kernels/utils.h"``);
    ``<metal_stdlib>`` is mtwork's shim. `prelude` is placed before the source, as a
    ``.metal`` file that includes a header would (MLX's ``arange.metal`` includes
    ``utils.h`` before ``arange.h``). `defines` are preprocessor macros, as a host
    program sets them when it compiles the library (llama.cpp's ``GGML_METAL_HAS_BF16``):
    a name maps to an int, a bool or text. `math_mode` is ``"safe"`` (MLX's default),
    ``"relaxed"`` or ``"fast"``. Kernels are listed as Metal would see them, after the
    preprocessor: host names made by macros count, ``#if`` branches that are off do not.
    `msl_version` and `gpu_family` say what `sim` holds the library to (default
    $MTWORK_MSL_VERSION or "3.2", $MTWORK_GPU_FAMILY or "apple7"; see
    `mtwork.msl.target`): the language version's rules and what its compiler predefines
    (``__METAL_VERSION__``, ...), the family's limits.
    The files are read now; load again to see later edits.
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
    target = resolve_target(msl_version, gpu_family)
    path = _as_path(source)
    if path is None:
        text, label = str(source), name or "source"
    else:
        text, label = path.read_text(), name or str(path)
    dirs = tuple(Path(d).resolve() for d in include_dirs)
    return Library(text, path=path, label=label, include_dirs=dirs, prelude=prelude,
                   defines=_define_values(defines), math_mode=math_mode, backend=backend,
                   target=target)


def _define_values(defines: Mapping[str, Any] | None) -> dict[str, str]:
    if defines is None:
        return {}
    if not isinstance(defines, Mapping):
        raise TypeError(f"`defines` maps macro names to values, got {type(defines).__name__}")
    out = {}
    for name, value in defines.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"`defines`: macro names are identifiers, got {name!r}")
        if isinstance(value, bool):
            out[name] = "1" if value else "0"
        elif isinstance(value, (int, str)):
            out[name] = str(value)
        else:
            raise TypeError(f"`defines`: {name} takes an int, a bool or text, not "
                            f"{type(value).__name__} {value!r}")
    return out


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
                 include_dirs: tuple[Path, ...], prelude: str, defines: Mapping[str, str],
                 math_mode: str, backend: str | None, target: MslTarget = DEFAULT_MSL_TARGET):
        self.text = text
        self.target = target
        self.path = path
        self.label = label
        self.prelude = prelude
        self.defines = dict(defines)
        self.math_mode = math_mode
        self.backend = backend
        self.include_dirs = include_dirs
        folder = path.parent if path else None
        self.search_dirs = ((folder,) if folder else ()) + include_dirs
        self.files = included_files(prelude + "\n" + text, folder, self.search_dirs)
        self.kernels: dict[str, KernelSignature] = {}
        self.function_constants: dict[str, FunctionConstant] = {}
        self.host_names: dict[str, Instantiation] = {}
        seen = preprocess(text, label=label, search_dirs=self.search_dirs, prelude=prelude,
                          defines={**target.predefined_macros(), **self.defines},
                          files=tuple(self.files.items()))
        parsed = parse_source(seen.text, label, origin=seen.origin)
        mask = code_without_directives(seen.text)
        # What a `[[function_constant(name)]]` may name: any program-scope constant.
        self.constant_names = frozenset(constant_names(mask))
        # Kernels Metal refuses for what they return, which are therefore not listed.
        self._not_void = {name: Violation("kernel-return", *seen.origin(line_of(mask, at)), 0,
                                          kernel_return_message(name, returns))
                          for name, at, returns in non_void_kernels(mask)}
        for k in parsed.kernels:
            self.kernels.setdefault(k.name, k)
            if k.host_name and k.host_name != k.name:  # `[[host_name("h")]] kernel void f`
                self.host_names.setdefault(k.host_name, Instantiation(k.host_name, k.name, ()))
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
                       prelude=self.prelude, defines=self.defines, math_mode=self.math_mode,
                       backend=self.backend, target=self.target)

    def kernel_like(self, kernel: Kernel) -> Kernel:
        """`kernel` (a kernel of another version of this library) made from this one: the
        same function, template arguments and function constants."""
        signature = self.kernels.get(kernel.signature.name)
        if signature is None:
            raise KeyError(f"the library no longer defines kernel `{kernel.signature.name}`; "
                           f"it defines: {', '.join(self.names()) or 'none'}")
        instantiated = kernel.instantiated and kernel.name in self.host_names
        return Kernel(self, signature, kernel.template_args, dict(kernel.constants),
                      kernel.name, instantiated=instantiated)

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
        return Kernel(self, signature, args, self._constant_values(constants), label,
                      instantiated=instantiation is not None)

    def _signature(self, name: str) -> KernelSignature:
        try:
            return self.kernels[name]
        except KeyError:
            if name in self._not_void:
                raise MetalRuleError(name, [self._not_void[name]]) from None
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
