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
for scalars, Python numbers (converted to the declared type, with range checks).

On ``sim`` the source is compiled with its included files rewritten for the emulator (a
copy of them lives in the cache); on ``metal`` the kernel runs through
``mx.fast.metal_kernel`` (see `metal_wrapper`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from . import dtypes
from .backends import resolve as resolve_backend
from .errors import CompileError, ThreadgroupMemoryError
from .limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES
from .signature import (
    METAL_TYPE_NAMES,
    FunctionConstant,
    Instantiation,
    KernelParam,
    KernelSignature,
    TemplateParam,
    TypeInfo,
    function_constant_macros,
    parse_source,
    rewrite_function_constants,
    strip_msl_only_syntax,
    type_info,
)
from .source import MATH_MODES

__all__ = ["Kernel", "Library", "NewBuffer", "Outputs", "load_metal", "metal_wrapper",
           "new_buffer"]

MAX_BUFFER_INDEX = 30  # Metal's argument table has 31 buffer slots
THREADGROUP_MEMORY_ALIGNMENT = 16  # setThreadgroupMemoryLength: a multiple of 16 bytes
_TG_SLOT_BASE = MAX_BUFFER_INDEX + 1  # threadgroup offsets follow the buffers in the table

_SOURCE_SUFFIXES = (".metal", ".h", ".hpp", ".hh", ".inc", ".msl")


# ---------------------------------------------------------------------------------------
# Loading


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
        raise ValueError(f"math_mode must be one of {', '.join(MATH_MODES)}, got {math_mode!r}")
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
    if isinstance(source, str) and ("\n" in source
                                    or not source.rstrip().endswith(_SOURCE_SUFFIXES)):
        return None
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no MSL file at {path}")
    return path.resolve()


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?P<open>[<"])(?P<name>[^>"\n]+)[>"]', re.M)


def _find_include(name: str, quoted: bool, including_dir: Path | None,
                  search_dirs: Sequence[Path]) -> Path | None:
    """Where `#include` finds `name` among the user's folders (None: elsewhere)."""
    dirs = ([including_dir] if quoted and including_dir else []) + list(search_dirs)
    for d in dirs:
        candidate = d / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def _included_files(text: str, folder: Path | None,
                    search_dirs: Sequence[Path]) -> dict[Path, str]:
    """Every user file `text` reaches through `#include`, with its text."""
    found: dict[Path, str] = {}
    pending = [(text, folder)]
    while pending:
        current, here = pending.pop()
        for m in _INCLUDE.finditer(current):
            path = _find_include(m.group("name"), m.group("open") == '"', here, search_dirs)
            if path is not None and path not in found:
                found[path] = path.read_text()
                pending.append((found[path], path.parent))
    return found


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _line_directive(label: str) -> str:
    return '#line 1 "' + label.replace("\\", "\\\\").replace('"', '\\"') + '"\n'


def _for_emulator(text: str) -> str:
    """A user file as the emulator compiles it (lines unchanged)."""
    from .backends.sim.rewrite import rewrite_msl

    return rewrite_msl(strip_msl_only_syntax(rewrite_function_constants(text))).text


@dataclass(frozen=True)
class _SourceTree:
    """The rewritten copy of the library's files in the cache: the main file and the
    folders that `#include` searches, at the same relative places as the originals."""

    main: Path
    include_dirs: tuple[Path, ...]


_tree_lock = threading.Lock()


def _build_tree(main_text: str, main_label: str, main_path: Path | None,
                files: Mapping[Path, str], search_dirs: Sequence[Path]) -> _SourceTree:
    from .backends.sim.compiler import cache_dir

    tool = (Path(__file__).parent / "backends" / "sim" / "rewrite.py").read_text()
    this = Path(__file__).with_name("signature.py").read_text()
    parts = [tool, this, main_label, main_text, str(main_path)]
    for path in sorted(files):
        parts += [str(path), files[path]]
    root = cache_dir() / "sources" / _digest(*parts, *map(str, search_dirs))

    def mirrored(path: Path) -> Path:
        return root / path.relative_to(path.anchor)

    main = mirrored(main_path) if main_path else root / "__source__" / "source.metal"
    dirs = tuple(mirrored(d) for d in search_dirs)
    with _tree_lock:
        if not root.exists():
            root.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix="tmp-"))
            rel = main.relative_to(root)
            for path, text in [(tmp / rel, _line_directive(main_label) + _for_emulator(main_text)),
                               *((tmp / p.relative_to(p.anchor),
                                  _line_directive(str(p)) + _for_emulator(t))
                                 for p, t in files.items())]:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            for d in dirs:
                (tmp / d.relative_to(root)).mkdir(parents=True, exist_ok=True)
            try:
                os.replace(tmp, root)
            except OSError:  # another process built it first
                shutil.rmtree(tmp, ignore_errors=True)
    return _SourceTree(main, dirs)


# ---------------------------------------------------------------------------------------
# The library


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
        folder = path.parent if path else None
        self.search_dirs = ((folder,) if folder else ()) + include_dirs
        self.files = _included_files(prelude + "\n" + text, folder, self.search_dirs)
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
        self._sim_libraries: dict[str, Any] = {}  # by translation unit
        self._compile_lock = threading.Lock()

    @cached_property
    def _tree(self) -> _SourceTree:
        return _build_tree(self.text, self.label, self.path, self.files, self.search_dirs)

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
        instantiation = self.host_names.get(name)
        if instantiation is not None:
            if template is not None:
                raise CompileError(name, f"`{name}` is an explicit instantiation "
                                         f"({instantiation.function_text}); it takes no template")
            signature = self._signature(instantiation.function)
            args = _template_texts(signature, list(instantiation.template_args), name)
            label = name
        else:
            signature = self._signature(name)
            args = _template_texts(signature, template, name)
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
            bits = _scalar_array(value, info, f"function constant `{constant.name}` "
                                             f"({constant.type_text})")
            values[constant.name] = _literal(bits, info)
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


# ---------------------------------------------------------------------------------------
# Template arguments and constant values as source text


def _type_text(value: Any) -> str | None:
    """Metal's name for a type given as an mx dtype, numpy dtype or Python type."""
    if isinstance(value, mx.Dtype):
        return METAL_TYPE_NAMES.get(value)
    if value is bool:
        return "bool"
    if value is int:
        return "int"
    if value is float:
        return "float"
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        return None
    for mx_dtype, name in METAL_TYPE_NAMES.items():
        if mx_dtype != mx.bfloat16 and dtypes.storage_numpy_dtype(mx_dtype) == np_dtype:
            return name
    return None


def _template_value_text(param: TemplateParam, value: Any, kernel: str) -> str:
    if isinstance(value, str):
        return value.strip()
    if param.is_type:
        text = _type_text(value)
        if text is None:
            raise CompileError(kernel, f"template parameter `{param.name}` is a type; "
                                       f"{value!r} is not a Metal type")
        return text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    raise CompileError(kernel, f"template parameter `{param.kind} {param.name}` takes a "
                               f"value, not {value!r}")


def _template_texts(signature: KernelSignature, template: Any, label: str) -> tuple[str, ...]:
    """The template arguments written out, up to the last one given (the parameters after
    it keep their defaults, as in C++)."""
    params = signature.template_params
    if not params:
        if template:
            raise CompileError(label, f"`{signature.name}` is not a template")
        return ()
    if template is None:
        template = {}
    if isinstance(template, Mapping):
        unknown = set(template) - {p.name for p in params}
        if unknown:
            raise CompileError(label, f"`{signature.name}` has no template parameter "
                                      f"{', '.join(map(repr, sorted(unknown)))}")
        values = [template.get(p.name) for p in params]
    else:
        values = list(template) if isinstance(template, (list, tuple)) else [template]
        if len(values) > len(params):
            raise CompileError(label, f"`{signature.name}` takes {len(params)} template "
                                      f"arguments, got {len(values)}")
        values += [None] * (len(params) - len(values))
    while values and values[-1] is None and params[len(values) - 1].default is not None:
        values.pop()
    texts = []
    for p, v in zip(params, values):
        if v is None and p.default is None:
            raise CompileError(label, _missing_template_message(signature, p))
        texts.append(_substitute(p.default, dict(zip([q.name for q in params], texts)))
                     if v is None else _template_value_text(p, v, label))
    return tuple(texts)


def _substitute(text: str, names: Mapping[str, str]) -> str:
    """`text` with each template parameter name replaced by its argument."""
    if not names:
        return text
    pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], text)


def _missing_template_message(signature: KernelSignature, param: TemplateParam) -> str:
    kinds = ", ".join(f"{p.kind} {p.name}" for p in signature.template_params)
    return (f"`{signature.name}` is a template <{kinds}> and no value was given for "
            f"`{param.name}`: pass template=(...) or use a host name of its instantiations")


def _literal(bits: np.ndarray, info: TypeInfo) -> str:
    """A C++ literal of the converted scalar `bits` (storage dtype)."""
    if info.dtype == mx.bool_:
        return "true" if bool(bits.reshape(-1)[0]) else "false"
    if info.dtype == mx.bfloat16:
        value = float(np.array(mx.array(bits.reshape(-1)[:1]).view(mx.bfloat16)
                               .astype(mx.float32))[0])
    else:
        value = bits.reshape(-1)[0].item()
    if isinstance(value, float):
        if not np.isfinite(value):
            raise ValueError(f"function constants must be finite, got {value}")
        return repr(float(np.float32(value))) + "f"
    return str(value)


# ---------------------------------------------------------------------------------------
# Values for buffers


@dataclass(frozen=True)
class NewBuffer:
    """A buffer the dispatch makes: `shape` elements of `dtype` (default: the declared
    element type), filled with `fill`, or on sim with a poison pattern (NaN for floats,
    0xBE bytes otherwise) so that elements the kernel forgets to write show up."""

    shape: tuple[int, ...]
    dtype: Any = None
    fill: float | int | None = None


def new_buffer(shape: int | Sequence[int], dtype: Any = None, *,
               fill: float | int | None = None) -> NewBuffer:
    """Asks a dispatch for a new buffer; it comes back in the dispatch's `Outputs`."""
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    return NewBuffer(dims, dtype, fill)


class Outputs(dict):
    """The kernel's writable buffers after a dispatch, as numpy arrays by parameter name
    (bfloat16 data as its uint16 bits). A numpy array the caller passed is the same
    object, written in place. ``outputs.mx(name)`` gives the buffer as an ``mx.array``."""

    def __init__(self, arrays: Mapping[str, np.ndarray], kinds: Mapping[str, mx.Dtype | None]):
        super().__init__(arrays)
        self._kinds = dict(kinds)

    def mx(self, name: str) -> mx.array:
        out = mx.array(self[name])
        return out.view(mx.bfloat16) if self._kinds.get(name) == mx.bfloat16 else out


def _describe(p: KernelParam) -> str:
    return f"{p.kind}({p.index}) `{p.name}` ({p.type_text})"


def _python_number(value: Any, info: TypeInfo, what: str) -> Any:
    """Checks a Python number against the declared scalar type and returns it."""
    kind = np.dtype(dtypes.storage_numpy_dtype(info.dtype)).kind
    if info.dtype == mx.bfloat16:
        kind = "f"
    if isinstance(value, (bool, np.bool_)):
        if info.dtype != mx.bool_:
            raise TypeError(f"{what} takes a {_name(info)}, not the bool {value!r}")
        return bool(value)
    if info.dtype == mx.bool_:
        raise TypeError(f"{what} takes a bool, not {type(value).__name__} {value!r}")
    if isinstance(value, (int, np.integer)):
        if kind in "iu":
            limits = np.iinfo(dtypes.storage_numpy_dtype(info.dtype))
            if not limits.min <= int(value) <= limits.max:
                raise ValueError(f"{what}: {value} is outside the range of {_name(info)} "
                                 f"[{limits.min}, {limits.max}]")
        return int(value)
    if isinstance(value, (float, np.floating)):
        if kind in "iu":
            raise TypeError(f"{what} takes an integer ({_name(info)}), not the float {value!r}")
        return float(value)
    if isinstance(value, complex) and kind == "c":
        return value
    raise TypeError(f"{what} takes a {_name(info)}, not {type(value).__name__} {value!r}")


def _name(info: TypeInfo) -> str:
    base = METAL_TYPE_NAMES.get(info.dtype, str(info.dtype))
    return base + (str(info.lanes) if info.lanes > 1 else "")


def _scalar_array(value: Any, info: TypeInfo, what: str) -> np.ndarray:
    """A scalar or vector value as the declared type's bytes (storage dtype, padded)."""
    storage = dtypes.storage_numpy_dtype(info.dtype)
    if isinstance(value, mx.array):
        if value.dtype != info.dtype or value.size != info.lanes:
            raise TypeError(f"{what} takes a {_name(info)}, got an mx.array of "
                            f"{value.size} {value.dtype}")
        flat = np.array(value.view(mx.uint16) if value.dtype == mx.bfloat16 else value).ravel()
    elif isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype.kind != "O":
        arr = np.asarray(value)
        if arr.dtype != storage or arr.size != info.lanes:
            raise TypeError(f"{what} takes a {_name(info)}, got a numpy {arr.dtype} value of "
                            f"{arr.size} element(s)")
        flat = arr.ravel()
    else:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if len(items) != info.lanes:
            raise TypeError(f"{what} takes {info.lanes} value(s), got {len(items)}")
        numbers = [_python_number(v, info, what) for v in items]
        if info.dtype == mx.bfloat16:
            flat = np.array(mx.array(numbers, dtype=mx.bfloat16).view(mx.uint16))
        else:
            flat = np.array(numbers, dtype=storage)
    out = np.zeros(info.storage_lanes, dtype=storage)
    out[: info.lanes] = flat
    return out


def _raw_bytes(value: Any, what: str) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(value), dtype=np.uint8).copy()
    if isinstance(value, (np.ndarray, np.generic)):
        return np.ascontiguousarray(value)
    raise TypeError(f"{what} is a struct: pass its bytes (a numpy array, e.g. with a "
                    f"structured dtype matching its layout, or bytes), not "
                    f"{type(value).__name__}")


def _check_array_dtype(arr: np.ndarray | mx.array, info: TypeInfo | None, what: str) -> None:
    if info is None:
        return
    if isinstance(arr, mx.array):
        ok = arr.dtype == info.dtype
    else:
        ok = arr.dtype == dtypes.storage_numpy_dtype(info.dtype)
    if not ok:
        raise TypeError(f"{what} points at {_name(info)} data; got an array of {arr.dtype} "
                        f"(convert it, or view its bytes as the declared type)")


def _new_array(request: NewBuffer, info: TypeInfo | None, what: str) -> tuple[np.ndarray,
                                                                              mx.Dtype]:
    if request.dtype is None:
        if info is None:
            raise TypeError(f"{what}: give new_buffer a dtype (the element type is a struct)")
        dtype = info.dtype
    elif isinstance(request.dtype, mx.Dtype):
        dtype = request.dtype
    else:
        dtype = dtypes.mx_dtype_from_numpy(request.dtype)
    shape = tuple(request.shape)
    if info is not None and info.storage_lanes > 1 and request.dtype is None:
        shape = (*shape, info.storage_lanes)
    from .backends.sim import filled, poisoned

    if request.fill is None:
        return poisoned(dtype, shape), dtype
    return filled(dtype, shape, request.fill), dtype


@dataclass
class _Binding:
    param: KernelParam
    array: np.ndarray  # the memory the kernel sees
    dtype: mx.Dtype | None  # its element type, where known


def _bind_value(p: KernelParam, value: Any, info: TypeInfo | None, what: str) -> _Binding:
    if p.is_pointer:
        if isinstance(value, NewBuffer):
            arr, dtype = _new_array(value, info, what)
            return _Binding(p, arr, dtype)
        if isinstance(value, mx.array):
            _check_array_dtype(value, info, what)
            view = value.view(mx.uint16) if value.dtype == mx.bfloat16 else value
            # A copy: mx arrays are values, a writable buffer's result comes back in Outputs.
            return _Binding(p, np.array(view, copy=True, order="C"), value.dtype)
        if isinstance(value, np.ndarray):
            _check_array_dtype(value, info, what)
            if p.writable and not (value.flags.c_contiguous and value.flags.writeable):
                raise ValueError(f"{what} is written by the kernel: pass a writable, "
                                 f"C-contiguous numpy array (np.ascontiguousarray(...))")
            arr = value if p.writable else np.ascontiguousarray(value)
            return _Binding(p, arr, info.dtype if info else None)
        raise TypeError(f"{what} is a pointer: pass an array (numpy or mx) or "
                        f"mtwork.new_buffer(...), not {type(value).__name__} {value!r}")
    if info is None:
        return _Binding(p, _raw_bytes(value, what), None)
    return _Binding(p, _scalar_array(value, info, what), info.dtype)


# ---------------------------------------------------------------------------------------
# Dispatch geometry


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    items = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    ok = 1 <= len(items) <= 3 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in items
    )
    if not ok:
        raise ValueError(f"`{what}` must be one to three positive integers, got {value!r}")
    padded = [int(v) for v in items] + [1] * (3 - len(items))
    return padded[0], padded[1], padded[2]


def _geometry(threadgroups: Any, grid: Any, threads_per_threadgroup: Any,
              max_threads: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(threads in the grid, threads per threadgroup) for either kind of dispatch."""
    if (threadgroups is None) == (grid is None):
        raise TypeError("give either threadgroups= (dispatchThreadgroups: a count of "
                        "threadgroups) or grid= (dispatchThreads: a count of threads)")
    if threads_per_threadgroup is None:
        raise TypeError("threads_per_threadgroup= is required")
    tg = _dims(threads_per_threadgroup, "threads_per_threadgroup")
    threads = tg[0] * tg[1] * tg[2]
    if threads > max_threads:
        raise ValueError(f"threads_per_threadgroup {tg} has {threads} threads, more than the "
                         f"{max_threads} this kernel's threadgroups may have")
    if grid is not None:
        return _dims(grid, "grid"), tg
    groups = _dims(threadgroups, "threadgroups")
    return (groups[0] * tg[0], groups[1] * tg[1], groups[2] * tg[2]), tg


# ---------------------------------------------------------------------------------------
# Kernels


class Kernel:
    """One kernel of a `Library`, its template instantiated and its function constants
    set. Call it to dispatch; `compile()` compiles it for sim ahead of time."""

    def __init__(self, library: Library, signature: KernelSignature,
                 template_args: tuple[str, ...], constants: dict[str, str | None], label: str):
        self.library = library
        self.signature = signature
        self.template_args = template_args
        self.constants = constants
        self.name = label
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
                                  else _substitute(param.default or "", values))
        return values

    def param_type(self, p: KernelParam) -> str:
        """`p`'s declared type with the template arguments in place."""
        return _substitute(p.type_text, self.template_values)

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

    # -- binding ---------------------------------------------------------------------

    def _bind(self, buffers: Mapping[int | str, Any] | Sequence[Any] | None) -> list[_Binding]:
        params = self.signature.buffers
        if buffers is None:
            buffers = {}
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
        return [
            _bind_value(p, value, self.element_info(p), f"{_describe(p)} of `{self.name}`")
            for p, value in chosen.values()
        ]

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
        given: dict[int, int] = {}
        for key, size in (sizes or {}).items():
            p = None if isinstance(key, bool) else next(
                (q for q in params if key in (q.index, q.name)), None)
            if p is None:
                have = ", ".join(_describe(q) for q in params) or "none"
                raise TypeError(f"kernel `{self.name}` has no threadgroup({key}) argument; "
                                f"it has: {have}")
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size <= 0:
                raise ValueError(f"{_describe(p)}: the size is a positive number of bytes, "
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

    # -- running ---------------------------------------------------------------------

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
    ) -> Outputs:
        """Dispatches the kernel and returns its writable buffers.

        `buffers`: by ``[[buffer(n)]]`` index or parameter name (a sequence binds indices
        0, 1, ...). `threadgroup_memory`: bytes for each ``[[threadgroup(n)]]`` argument.
        Give `threadgroups` (``dispatchThreadgroups``: how many threadgroups) or `grid`
        (``dispatchThreads``: how many threads; edge threadgroups are partial), and
        `threads_per_threadgroup`. `timeout`: the sim watchdog, in seconds.
        """
        limit = min(MAX_THREADS_PER_THREADGROUP,
                    self.signature.max_threads or MAX_THREADS_PER_THREADGROUP)
        grid3, tg3 = _geometry(threadgroups, grid, threads_per_threadgroup, limit)
        bindings = self._bind(buffers)
        sizes = self._threadgroup_sizes(threadgroup_memory)
        if resolve_backend(backend or self.library.backend) == "metal":
            run_on_metal(self, bindings, sizes, grid3, tg3)
        else:
            self._run_on_sim(bindings, sizes, grid3, tg3, timeout)
        written = [b for b in bindings if b.param.writable]
        return Outputs({b.param.name: b.array for b in written},
                       {b.param.name: b.dtype for b in written})

    def _run_on_sim(self, bindings: list[_Binding], threadgroup_sizes: dict[int, int],
                    grid: tuple[int, int, int], tg: tuple[int, int, int],
                    timeout: float | None) -> None:
        from .backends.sim import runtime

        library = self._sim_library
        slots = _TG_SLOT_BASE + max(threadgroup_sizes, default=-1) + 1
        table = (ctypes.c_void_p * slots)()
        for b in bindings:
            table[b.param.index] = b.array.ctypes.data if b.array.size else None
        # [[threadgroup(n)]] arguments sit at the start of threadgroup memory, in index
        # order; the launcher adds the offset in slot n to the group's memory.
        offset = 0
        for index, size in threadgroup_sizes.items():
            table[_TG_SLOT_BASE + index] = offset
            offset += size
        runtime.dispatch(library, self.name, table, grid, tg, tg_static_bytes=offset,
                         timeout=timeout)

    # -- compiling for sim -----------------------------------------------------------

    def translation_unit(self) -> str:
        """The C++ the emulator compiles: constants, prelude, the library, the launcher."""
        from .backends.sim.launcher import launcher_source

        macros = function_constant_macros({
            name: (c.type_text, self.constants.get(name))
            for name, c in self.library.function_constants.items()
        })
        main = str(self.library._tree.main).replace("\\", "\\\\").replace('"', '\\"')
        prelude = self.library.prelude
        if prelude and not prelude.endswith("\n"):
            prelude += "\n"
        launcher = launcher_source(self.function, self._launch_params())
        return f'{macros}{prelude}#include "{main}"\n{launcher}'

    def _launch_params(self) -> list:
        from .backends.sim.launcher import LaunchParam

        out = []
        for p in self.signature.params:
            ty = self.param_type(p)
            if p.kind == "attribute":
                out.append(LaunchParam("attribute", ty, attribute=p.attribute))
            elif p.kind == "threadgroup":
                out.append(LaunchParam("threadgroup", ty, slot=_TG_SLOT_BASE + p.index))
            else:
                out.append(LaunchParam("buffer", ty, slot=p.index))
        return out

    def compile(self) -> Kernel:
        """Compiles the kernel for sim now (a `CompileError` quotes the author's files and
        lines); dispatching compiles it otherwise. Returns the kernel."""
        self._sim_library  # noqa: B018 - compiles on first use
        return self

    @cached_property
    def _sim_library(self):
        from .backends.sim import compiler, runtime

        lib = self.library
        tu = self.translation_unit()
        with lib._compile_lock:
            hit = lib._sim_libraries.get(tu)
        if hit is not None:
            return hit
        path = compiler.compile_kernel(compiler.Translation(tu, ()), lib.math_mode, self.name,
                                       include_dirs=lib._tree.include_dirs)
        loaded = runtime.load(path)
        with lib._compile_lock:
            lib._sim_libraries[tu] = loaded
        return loaded


# The metal path lives in its own module; imported last, it can use the names above.
from .library_metal import metal_wrapper, run_on_metal  # noqa: E402
