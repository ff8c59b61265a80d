"""Compiles emulated kernels with clang (from the `ziglang` package) and caches the results.

Three things are built and kept under the cache folder, each keyed by a hash of what
went into it, so a change anywhere rebuilds exactly what depends on it:

- the runtime library (fibers, scheduler, worker pool), once per runtime source;
- a rewritten copy of MLX's Metal kernel headers, once per MLX version and rewrite;
- one shared library per kernel source, compile options and shim version.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ... import cachedir
from ...cachedir import cache_dir
from ...dispatch import Sources
from ...errors import CompileError, EmulatorUnavailable
from ...msl.includes import mlx_include_dir
from ...toolchain import run_clang
from .instrument import author_place, instrument
from .rewrite import rewrite_msl

PACKAGE_DIR = Path(__file__).parent
SHIM_DIR = PACKAGE_DIR / "include"
RUNTIME_DIR = PACKAGE_DIR / "runtime"

COMMON_FLAGS = (
    "-std=c++20",
    "-O2",
    "-fPIC",
    "-fdeclspec",
    "-fno-exceptions",
    "-fno-rtti",
    # Every function convergent, as for GPU languages: the optimizer may not split a
    # barrier or SIMD-group call into several call sites (jump threading does otherwise).
    "-fconvergent-functions",
    # Float-to-integer conversions saturate (NaN gives 0), as GPU conversions do.
    "-fno-strict-float-cast-overflow",
    # No peeling or unrolling of loops: a SIMD-group function inside a loop then stays one
    # call site, which the runtime's divergence handling relies on.
    "-fno-unroll-loops",
    # Stack probes: a frame larger than a page touches each of its pages in order, so a
    # big private array faults in the fiber's guard instead of jumping over it.
    "-fstack-clash-protection",
    "-nostdlib++",  # kernels and runtime use no C++ library: nothing for zig to build
    "-Wno-unknown-attributes",
    "-Wno-unknown-pragmas",
    "-Wno-c++11-narrowing",
    "-Wno-ignored-attributes",
    "-Xclang",
    "-ffloat16-excess-precision=none",
    "-Xclang",
    "-fbfloat16-excess-precision=none",
)
# "safe" rounds every operation (no fused multiply-add), the other modes allow contraction.
MATH_MODE_FLAGS = {
    "safe": ("-ffp-contract=off",),
    "relaxed": ("-ffp-contract=fast", "-fno-signed-zeros", "-fno-trapping-math",
                "-freciprocal-math", "-fassociative-math"),
    "fast": ("-ffast-math", "-ffp-contract=fast"),
}
# The x86 bfloat conversion instruction flushes subnormals; the shim's __truncsfbf2 rounds.
# (Given any -m flag, zig drops its default native target: name it again.)
TARGET_FLAGS = (
    ("-march=native", "-mno-avx512bf16") if platform.machine() in ("x86_64", "AMD64") else ()
)
KERNEL_DEFINES = ("-D__METAL_VERSION__=320", "-DMLX_METAL_JIT", "-D__HAVE_MTWORK_EMULATOR__=1")
# Kernels keep the arrays they index on a private stack of their own (clang's SafeStack;
# the runtime says where each fiber's is): a thread-private array indexed out of bounds,
# which the GPU tolerates (MLX's layer_norm writes below one), then overwrites the
# thread's own scratch rather than a return address (see runtime/fiber.h).
KERNEL_FLAGS = ("-fsanitize=safe-stack", "-mllvm", "-safestack-use-pointer-address")

_build_lock = threading.Lock()


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def _tree_digest(folder: Path, pattern: str = "*") -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob(pattern)):
        if f.is_file():
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:24]


@cache
def shim_version() -> str:
    return _digest(_tree_digest(SHIM_DIR), _tree_digest(RUNTIME_DIR), " ".join(COMMON_FLAGS))


def _reusable(target: Path) -> bool:
    """Whether a cached artefact can be used: present and whole; one that is not (cut
    short, zeroed, changed) is removed, to be built again."""
    if cachedir.is_sealed(target):
        cachedir.used(target)
        return True
    if target.exists() or target.with_name(target.name + ".seal").exists():
        cachedir.discard(target)
    return False


@cache
def runtime_library() -> Path:
    """Builds (once) and returns the runtime shared library."""
    sources = sorted(RUNTIME_DIR.glob("*.cpp"))
    target = cache_dir() / f"libmtwrt-{shim_version()}.so"
    cachedir.pin(target)
    with _build_lock:
        if _reusable(target):
            return target
        work = cachedir.work_dir(cache_dir())
        try:
            tmp = work / target.name
            args = [*COMMON_FLAGS, "-shared", "-pthread",
                    "-isystem", str(SHIM_DIR), *map(str, sources), "-o", str(tmp)]
            result = run_clang(args, "the emulator runtime")
            if result.returncode != 0:
                raise EmulatorUnavailable(
                    f"building the emulator runtime failed:\n{result.stderr}")
            cachedir.publish(tmp, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


@cache
def prelude_dir() -> Path:
    """A copy of MLX's Metal kernel headers with the emulator's rewrites applied."""
    source = mlx_include_dir()
    if source is None:
        raise EmulatorUnavailable(
            "the installed mlx package has no Metal kernel headers (mlx/include/...): "
            "install mlx >= 0.32 (`pip install 'mlx[cpu]'` on Linux)"
        )
    kernels = source / "mlx" / "backend" / "metal" / "kernels"
    rewrite_hash = _digest((PACKAGE_DIR / "rewrite.py").read_bytes())
    target = cache_dir() / f"mlx-headers-{_tree_digest(kernels, '*.h')}-{rewrite_hash}"
    cachedir.pin(target)  # every compile of this process includes from it
    with _build_lock:
        if _reusable(target):
            return target
        tmp = cachedir.work_dir(cache_dir())
        for header in kernels.rglob("*.h"):
            out = tmp / header.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(rewrite_msl(header.read_text()))
        cachedir.publish(tmp, target)
    return target


@dataclass(frozen=True)
class Translation:
    """One kernel's C++ translation unit, and the sources whose lines its messages name."""

    text: str
    sources: Sources


# Sanitizer builds call the runtime before every load and store, and keep line tables so
# findings can name the source line.
# Vectorizing is off: the tracing has callbacks for accesses of up to 16 bytes only.
SANITIZE_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-g", "-DMTW_SANITIZE",
                  "-fno-vectorize", "-fno-slp-vectorize")
# Profiling builds report the same accesses to the runtime, and keep line tables: they say
# which function each instruction of the IR came from, by which instrument.py counts it
# as GPU work. Vectorizing is off for the tracing, as above.
PROFILE_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-gline-tables-only",
                 "-DMTW_PROFILE", "-fno-vectorize", "-fno-slp-vectorize")
# The profiler's code: a change to it rebuilds profiled kernels.
_PROFILER_SOURCES = tuple(PACKAGE_DIR / name for name in ("instrument.py", "llvm_ir.py",
                                                           "registers.py"))


def compile_kernel(tu: Translation, math_mode: str, kernel_label: str,
                   include_dirs: Sequence[Path] = (), sanitize: bool = False,
                   profile: bool = False) -> Path:
    """Compiles a translation unit into a shared library (cached) and returns its path.

    `include_dirs` are searched after the shim and MLX's headers (`-I`, in order);
    `sanitize` builds the instrumented variant the sanitizer mode runs; `profile` the
    profiler's, in a folder with the `instrument.Table` of its blocks (``table.json``).
    """
    flags = [*COMMON_FLAGS, *TARGET_FLAGS, *MATH_MODE_FLAGS[math_mode], *KERNEL_DEFINES,
             *KERNEL_FLAGS]
    if sanitize:
        flags += SANITIZE_FLAGS
    if profile:
        flags += PROFILE_FLAGS
    user_includes = [arg for d in include_dirs for arg in ("-I", str(d))]
    key = _digest(tu.text, " ".join(flags), shim_version(), str(mlx_include_dir()),
                  *user_includes, *(p.read_bytes() for p in _PROFILER_SOURCES if profile))
    target = cache_dir() / "kernels" / (f"{key}-profile" if profile else f"{key}.so")
    library = target / "kernel.so" if profile else target
    if _reusable(target):
        return library
    work = cachedir.work_dir(target.parent)
    try:
        cpp = work / "kernel.cpp"
        cpp.write_text(tu.text)
        includes = ["-isystem", str(SHIM_DIR), "-I", str(prelude_dir()), *user_includes]
        if profile:
            built = _compile_profiled(tu, flags, includes, cpp, kernel_label)
        else:
            built = work / "kernel.so"
            result = run_clang([*flags, "-shared", *includes, str(cpp), "-o", str(built)],
                               kernel_label)
            if result.returncode != 0:
                raise CompileError(kernel_label, _author_lines(result.stderr, tu, str(cpp)))
        cachedir.publish(built, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cachedir.evict(keep=target)
    return library


def _compile_profiled(tu: Translation, flags: list[str], includes: list[str], cpp: Path,
                      kernel_label: str) -> Path:
    """The profiled variant, in two steps: clang writes the optimised IR, instrument.py
    counts its blocks and adds the counting calls, and clang compiles that IR (without
    optimising it again). Returns the folder holding kernel.so and table.json."""
    folder = cpp.parent / "profiled"
    folder.mkdir()
    ir = cpp.with_suffix(".ll")
    result = run_clang([*flags, "-S", "-emit-llvm", *includes, str(cpp), "-o", str(ir)],
                       kernel_label)
    if result.returncode != 0:
        raise CompileError(kernel_label, _author_lines(result.stderr, tu, str(cpp)))
    text, table = instrument(ir.read_text(), shim_dir=str(SHIM_DIR),
                             place=author_place(tu.sources))
    counted = cpp.with_name("counted.ll")
    counted.write_text(text)
    # The coverage callbacks are in the IR already; defines and language flags do nothing.
    codegen = [f for f in flags if not f.startswith(("-fsanitize-coverage", "-D", "-std"))]
    result = run_clang([*codegen, "-Xclang", "-disable-llvm-passes", "-shared", str(counted),
                        "-o", str(folder / "kernel.so")], kernel_label)
    if result.returncode != 0:
        raise CompileError(kernel_label, f"the profiled build failed:\n{result.stderr}")
    (folder / "table.json").write_text(json.dumps(table.to_json()))
    return folder


_LOCATION = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+):(?P<col>\d+):")
_GUTTER = re.compile(r"^(\s*)(\d+)(?= \|)")


def _author_lines(stderr: str, tu: Translation, cpp_path: str) -> str:
    """Rewrites locations in the main file into the author's own names and lines (the body
    form's header and body), and those in the translation unit itself into
    ``<generated>``."""
    sources = tu.sources

    def relabel(m: re.Match) -> str:
        file, line, col = m.group("file"), int(m.group("line")), m.group("col")
        if file == cpp_path:
            return f"<generated>:{line}:{col}:"
        if file != sources.label or not sources.regions:
            return m.group(0)
        found = sources.author_line(line)
        name, at = found if found else ("<generated>", line)
        return f"{name}:{at}:{col}:"

    # Source excerpts carry the file's line numbers in their gutter (`   8 |   code`):
    # renumber them like the location above them.
    out, shift = [], 0
    for line in stderr.splitlines():
        located = _LOCATION.search(line)
        if located:
            mapped = _LOCATION.sub(relabel, line, count=1)
            new = _LOCATION.search(mapped)
            shift = int(located.group("line")) - int(new.group("line")) if new else 0
            line = mapped
        else:
            gutter = _GUTTER.match(line)
            if gutter and shift:
                number = str(int(gutter.group(2)) - shift).rjust(len(gutter.group(2)))
                line = f"{gutter.group(1)}{number}{line[gutter.end(2):]}"
        out.append(line)
    return "\n".join(out).replace(cpp_path, "<generated>")
