"""Compiles emulated kernels with clang (from the `ziglang` package) and caches the results.

Three things are built and kept under the cache folder, each keyed by a hash of what
went into it, so a change anywhere rebuilds exactly what depends on it:

- the runtime library (fibers, scheduler, worker pool), once per runtime source;
- a rewritten copy of MLX's Metal kernel headers, once per MLX version and rewrite;
- one shared library per kernel source, compile options and shim version.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import sys
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from ... import cachedir
from ...cachedir import cache_dir
from ...errors import CompileError, EmulatorUnavailable
from ...msl.includes import mlx_include_dir
from ...toolchain import run_clang
from .rewrite import rewrite_msl
from .translation import Translation, author_message

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


def digest(*parts: bytes | str) -> str:
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
    return digest(_tree_digest(SHIM_DIR), _tree_digest(RUNTIME_DIR), " ".join(COMMON_FLAGS))


def reusable(target: Path) -> bool:
    """Whether a cached artefact can be used: present and whole; one that is not (cut
    short, zeroed, changed) is removed, to be built again."""
    if cachedir.is_sealed(target):
        cachedir.used(target)
        return True
    if target.exists() or target.with_name(target.name + ".seal").exists():
        cachedir.discard(target)
    return False


# A first kernel call on a cold cache waits about this long on 2 cores (measured: the
# runtime 5 s, MLX's headers and the kernel itself the rest); said before the runtime's
# build starts, so that wait is not a silent one.
RUNTIME_BUILD_SECONDS = 10


@cache
def runtime_library() -> Path:
    """Builds (once) and returns the runtime shared library."""
    sources = sorted(RUNTIME_DIR.glob("*.cpp"))
    target = cache_dir() / f"libmtwrt-{shim_version()}.so"
    cachedir.pin(target)
    with _build_lock:
        if reusable(target):
            return target
        print(f"mtwork: building the emulator runtime, once: about {RUNTIME_BUILD_SECONDS} s",
              file=sys.stderr, flush=True)
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
    rewrite_hash = digest((PACKAGE_DIR / "rewrite.py").read_bytes())
    target = cache_dir() / f"mlx-headers-{_tree_digest(kernels, '*.h')}-{rewrite_hash}"
    cachedir.pin(target)  # every compile of this process includes from it
    with _build_lock:
        if reusable(target):
            return target
        tmp = cachedir.work_dir(cache_dir())
        for header in kernels.rglob("*.h"):
            out = tmp / header.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(rewrite_msl(header.read_text()))
        cachedir.publish(tmp, target)
    return target


# Sanitizer builds call the runtime before every load and store, and keep line tables so
# findings can name the source line.
# Vectorizing is off: the tracing has callbacks for accesses of up to 16 bytes only.
SANITIZE_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-g", "-DMTW_SANITIZE",
                  "-fno-vectorize", "-fno-slp-vectorize")


def compile_kernel(tu: Translation, math_mode: str, kernel_label: str,
                   include_dirs: Sequence[Path] = (), sanitize: bool = False) -> Path:
    """Compiles a translation unit into a shared library (cached) and returns its path.

    `include_dirs` are searched after the shim and MLX's headers (`-I`, in order);
    `sanitize` builds the instrumented variant the sanitizer mode runs.
    """
    flags = [*COMMON_FLAGS, *TARGET_FLAGS, *MATH_MODE_FLAGS[math_mode], *KERNEL_DEFINES,
             *KERNEL_FLAGS]
    if sanitize:
        flags += SANITIZE_FLAGS
    user_includes = [arg for d in include_dirs for arg in ("-I", str(d))]
    key = digest(tu.text, " ".join(flags), shim_version(), str(mlx_include_dir()),
                  *user_includes)
    target = cache_dir() / "kernels" / f"{key}.so"
    if reusable(target):
        return target
    work = cachedir.work_dir(target.parent)
    try:
        cpp = work / "kernel.cpp"
        cpp.write_text(tu.text)
        tmp = work / "kernel.so"
        args = [*flags, "-shared", "-isystem", str(SHIM_DIR),
                "-I", str(prelude_dir()), *user_includes, str(cpp), "-o", str(tmp)]
        result = run_clang(args, kernel_label)
        if result.returncode != 0:
            raise CompileError(kernel_label, author_message(result.stderr, tu, str(cpp)))
        cachedir.publish(tmp, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cachedir.evict(keep=target)
    return target
