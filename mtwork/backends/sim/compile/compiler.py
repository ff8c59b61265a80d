"""Compiles emulated kernels with clang (from the `ziglang` package) and caches the results.

Three things are built and kept under the cache folder, each keyed by a hash of what
went into it, so a change anywhere rebuilds exactly what depends on it:

- the runtime library (fibers, scheduler, worker pool), once per runtime source;
- a rewritten copy of MLX's Metal kernel headers, once per MLX version and rewrite;
- one shared library per kernel source, compile options and shim version;
- precompiled headers of the shim and the MLX headers kernels start with
  (`precompiled.py`), once per header list and compile flags.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from .... import cachedir
from ....cachedir import cache_dir
from ....errors import CompileError, EmulatorUnavailable
from ....host import HOST, Target
from ....msl.includes import mlx_include_dir
from ....msl.target import DEFAULT_MSL_TARGET, MslTarget
from ....toolchain import run_clang
from ..count.instrument import author_place, instrument
from . import precompiled
from .linking import run_link
from .log_formats import clarify
from .sources import for_emulator, rewriters_digest
from .translation import Translation, author_message

SIM_DIR = Path(__file__).parents[1]  # the emulator's package: include/ and runtime/ beside
SHIM_DIR = SIM_DIR / "include"
RUNTIME_DIR = SIM_DIR / "runtime"

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
    # Metal has no errno: sqrt is an instruction, which a loop over threads vectorizes,
    # not a call to the C library's for the errno of a negative argument.
    "-fno-math-errno",
    # No peeling or unrolling of loops: a SIMD-group function inside a loop then stays one
    # call site, which the runtime's divergence handling relies on.
    "-fno-unroll-loops",
    # Stack probes: a frame larger than a page touches each of its pages in order, so a
    # big private array faults in the fiber's guard instead of jumping over it. Given to
    # clang's front end: its driver passes the flag on for Linux targets only, but the
    # code generator probes on every target (macOS's default probes nothing).
    "-Xclang",
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
KERNEL_DEFINES = ("-DMLX_METAL_JIT", "-D__HAVE_MTWORK_EMULATOR__=1")


# Kernels keep the arrays they index on a private stack of their own (clang's SafeStack;
# the runtime says where each fiber's is): a thread-private array indexed out of bounds,
# which the GPU tolerates (MLX's layer_norm writes below one), then overwrites the
# thread's own scratch rather than a return address (see runtime/fiber.h).
#
# Vector loads and stores through pointers assume 4-byte alignment only (the types keep
# their layout: float4 is still 16-aligned in a struct): Apple GPUs access a float4 at any
# 4-byte boundary, and kernels rely on it (llama.cpp's mul_mm stores float4 rows of a
# dst whose rows are 70 floats), where an aligned x86 vector move would fault.
POINTER_ALIGN = 4
# SafeStack goes to clang's front end directly: its driver refuses it for macOS (where
# it would link a runtime library), but the pass works on every target, and the runtime
# gives the one function it calls.
KERNEL_FLAGS = ("-Xclang", "-fsanitize=safe-stack", "-mllvm", "-safestack-use-pointer-address",
                f"-fmax-type-align={POINTER_ALIGN}")

# One per artefact: the runtime builds in a thread of its own beside the headers.
_runtime_lock = threading.Lock()
_headers_lock = threading.Lock()


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
def shim_version(target: Target = HOST) -> str:
    """What a kernel built for `target` depends on besides its own text and flags: the
    shim, the runtime and the flags both are built with."""
    return digest(_tree_digest(SHIM_DIR), _tree_digest(RUNTIME_DIR),
                  " ".join((*COMMON_FLAGS, *target.compile_flags())))


def reusable(target: Path) -> bool:
    """Whether a cached artefact can be used: present and whole; one that is not (cut
    short, zeroed, changed) is removed, to be built again."""
    if cachedir.is_sealed(target):
        cachedir.used(target)
        return True
    if target.exists() or target.with_name(target.name + ".seal").exists():
        cachedir.discard(target)
    return False


# A first kernel call on a cold cache waits about this long on 2 cores (measured with
# bench/compile_small_kernel.py: the runtime's build, about 1 CPU second, runs beside
# MLX's headers being rewritten and the first kernel's compile); said before the runtime's
# build starts, so that wait is not a silent one.
RUNTIME_BUILD_SECONDS = 2


@cache
def runtime_library(target: Target = HOST) -> Path:
    """Builds (once) and returns the runtime shared library for `target` (this machine:
    the one mtwork loads; another: to prove it builds there)."""
    sources = sorted(RUNTIME_DIR.glob("*.cpp"))
    suffix = "" if target.is_host else f"-{target.name}"
    library = cache_dir() / f"libmtwrt-{shim_version(target)}{suffix}.so"
    cachedir.pin(library)
    with _runtime_lock, cachedir.build_lock(library):
        if reusable(library):
            return library
        if target.is_host:
            print(f"mtwork: building the emulator runtime, once: about "
                  f"{RUNTIME_BUILD_SECONDS} s", file=sys.stderr, flush=True)
        work = cachedir.work_dir()
        try:
            tmp = work / library.name
            # The kernels' target and flags: a kernel's code is inlined into no runtime
            # function, but both must agree on the vector ABI of what they pass.
            args = [*COMMON_FLAGS, *target.compile_flags(), "-shared", "-pthread",
                    "-isystem", str(SHIM_DIR), *map(str, sources), "-o", str(tmp)]
            result = run_link(args, tmp, "the emulator runtime", target)
            if result.returncode != 0:
                raise EmulatorUnavailable(
                    f"building the emulator runtime for {target.name} failed:\n"
                    f"{result.stderr}")
            cachedir.publish(tmp, library)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return library


@cache
def prelude_dir() -> Path:
    """A copy of MLX's Metal kernel headers as the emulator compiles them: the rewrites a
    kernel's own files get, function constants included (fft.h, sdpa_vector.h and the
    steel GEMM kernels declare theirs in the header a `.metal` file includes)."""
    return rewritten_mlx_headers("mlx-headers", for_emulator)


def rewritten_mlx_headers(kind: str, rewrite: Callable[[str], str]) -> Path:
    """A copy of the installed MLX's Metal kernel headers, each file passed through
    `rewrite`, kept in the cache (as `kind`-...) by the headers' content and the
    rewriters' code."""
    source = mlx_include_dir()
    if source is None:
        raise EmulatorUnavailable(
            "the installed mlx package has no Metal kernel headers (mlx/include/...): "
            "install mlx >= 0.32 (`pip install 'mlx[cpu]'` on Linux)"
        )
    kernels = source / "mlx" / "backend" / "metal" / "kernels"
    target = cache_dir() / f"{kind}-{_tree_digest(kernels, '*.h')}-{rewriters_digest()}"
    cachedir.pin(target)  # every compile of this process includes from it
    with _headers_lock, cachedir.build_lock(target):  # nobody replaces them mid-compile
        if reusable(target):
            return target
        tmp = cachedir.work_dir()
        for header in kernels.rglob("*.h"):
            out = tmp / header.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(rewrite(header.read_text()))
        cachedir.publish(tmp, target)
    return target


# Sanitizer builds call the runtime before every load and store, and keep line tables so
# findings can name the source line.
# Vectorizing is off: the tracing has callbacks for accesses of up to 16 bytes only.
# Copies and fills (struct and vector copies, zero-fill loops) stay llvm.memcpy/memmove/
# memset to the end of optimization, which the tracing does not see, and code generation
# expands them inline whatever -fno-builtin, -ffreestanding or -mllvm -max-store-memcpy
# say; the tracing skips atomic read-modify-writes too. AddressSanitizer's pass, run on
# its own (-Xclang: the driver refuses it beside SafeStack, and would link its runtime)
# with its checks of loads, stores, stacks and globals off, replaces each memory
# intrinsic with a call the runtime checks (mtw_sanitizer_memcpy, _memmove, _memset) and
# calls mtw_sanitizer_storeN before each atomic read-modify-write. It also keeps the
# optimizer from widening loads past what the source reads.
# Array subscripts with a bound clang knows (thread-private and threadgroup arrays) are
# checked by -fsanitize=array-bounds, which calls the runtime's __ubsan_handle_out_of_bounds;
# -fstrict-flex-arrays=3 checks a struct's last array member too.
_ASAN_OPTIONS = ("-asan-instrument-reads=0", "-asan-instrument-writes=0",
                 "-asan-instrument-byval=0", "-asan-stack=0", "-asan-globals=0",
                 "-asan-constructor-kind=none", "-asan-use-after-return=never",
                 "-asan-instrumentation-with-call-threshold=0",
                 "-asan-memory-access-callback-prefix=mtw_sanitizer_")
_COPIES_FILLS_ATOMICS = ("-Xclang", "-fsanitize=address",
                         *(arg for option in _ASAN_OPTIONS for arg in ("-mllvm", option)))
_ARRAY_BOUNDS = ("-fsanitize=array-bounds", "-fsanitize-recover=array-bounds",
                 "-fstrict-flex-arrays=3")
# Debug info names the shim's files under a fixed folder, not where this checkout sits: a
# kernel's cache key leaves the checkout's place out, so a library another checkout built
# into a shared cache is used here, and its findings must still tell the shim's frames.
SHIM_DEBUG_DIR = "/mtwork-shim"
SANITIZE_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-g", "-DMTW_SANITIZE",
                  "-fno-vectorize", "-fno-slp-vectorize", *_COPIES_FILLS_ATOMICS, *_ARRAY_BOUNDS,
                  f"-fdebug-prefix-map={SHIM_DIR}={SHIM_DEBUG_DIR}")
# Profiling builds report the same accesses to the runtime, and keep line tables: they say
# which function each instruction of the IR came from, by which instrument.py counts it
# as GPU work. Vectorizing is off for the tracing, as above.
PROFILE_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-gline-tables-only",
                 "-DMTW_PROFILE", "-fno-vectorize", "-fno-slp-vectorize")
# Lockstep builds (lockstep.py: kernels whose SIMD-groups rely on touching threadgroup
# memory in lockstep) report the same accesses, each threadgroup one a step of the
# SIMD-group (runtime/convergence.cpp). Vectorizing is off for the tracing, as above.
LOCKSTEP_FLAGS = ("-fsanitize-coverage=edge,trace-loads,trace-stores", "-fno-vectorize",
                  "-fno-slp-vectorize")
# The profiler's code: a change to it rebuilds profiled kernels.
_PROFILER_SOURCES = tuple(sorted((SIM_DIR / "count").glob("*.py")))


# zig's clang writes debug info unless told not to; only the sanitizer reads it (line
# tables name a finding's line). Without it MLX's scan.metal builds in 12.1 s, not 14.6 s.
NO_DEBUG_INFO = ("-g0",)
# Metal declares its types and address spaces before the first line of a file (MLX's
# defines.h uses `constant` and includes nothing): the shim's <metal_types> comes first.
METAL_PREDECLARED = ("-include", str(SHIM_DIR / "metal_types"))
# A kernel's calls of the C library's process exits go to the runtime (runtime/exits.cpp),
# which fails the dispatch: exit() in kernel code must not end the process running it, the
# caller's own in-process. mtw_exits.h renames them for the code after it, so every
# compile of a kernel reads it as text, never from a precompiled header (which would not
# keep the renames, and which clang then does not read the header again after).
EXITS_TO_RUNTIME = ("-include", str(SHIM_DIR / "mtw_exits.h"))


def compile_kernel(tu: Translation, math_mode: str, kernel_label: str,
                   include_dirs: Sequence[Path] = (), sanitize: bool = False,
                   profile: bool = False, lockstep: bool = False, target: Target = HOST,
                   msl_target: MslTarget = DEFAULT_MSL_TARGET) -> Path:
    """Compiles a translation unit into a shared library (cached) and returns its path.

    `include_dirs` are searched after the shim and before MLX's headers (`-I`, in order),
    as `load_metal` resolves includes; `sanitize` builds the instrumented variant the
    sanitizer mode runs; `profile` the profiler's, in a folder with the `instrument.Table`
    of its blocks (``table.json``); `lockstep` traces the plain build's loads and stores
    (both variants trace them);
    `target` is the machine it is built for (another than this one: to prove it builds),
    `msl_target` the language version (what Apple's compiler predefines).
    """
    flags = kernel_flags(math_mode, sanitize=sanitize, profile=profile, lockstep=lockstep,
                         target=target, msl_target=msl_target)
    link = target.link_flags()
    runtime = _runtime_beside() if target.is_host else None
    user_includes = [arg for d in include_dirs for arg in ("-I", str(d))]
    # The prelude's folder is named after MLX's headers and the rewrites applied to them: a
    # change to either rebuilds (and debug info names the folder the kernel was built with).
    key = digest(tu.text, " ".join([*flags, *link, *EXITS_TO_RUNTIME]), shim_version(target),
                 str(prelude_dir()), *user_includes, *include_order(user_includes),
                 *(p.read_bytes() for p in _PROFILER_SOURCES if profile))
    cached = cache_dir() / "kernels" / (f"{key}-profile" if profile else f"{key}.so")
    library = cached / "kernel.so" if profile else cached
    try:
        if reusable(cached):
            return library
        with cachedir.build_lock(cached):  # another process building it: wait, then reuse
            if reusable(cached):
                return library
            _build_kernel(tu, flags, link, user_includes, include_dirs, cached, profile,
                          kernel_label, target)
    finally:
        if runtime is not None:
            runtime.join()  # the caller loads the kernel next, or a worker process does
    cachedir.evict(keep=cached)
    return library


def _build_kernel(tu: Translation, flags: list[str], link: Sequence[str],
                  user_includes: list[str], include_dirs: Sequence[Path], cached: Path,
                  profile: bool, kernel_label: str, target: Target) -> None:
    """Builds the library (or the profiled folder) `cached` in a folder of its own."""
    work = cachedir.work_dir()
    try:
        cpp = work / "kernel.cpp"
        cpp.write_text(tu.text)
        includes = [*kernel_includes(user_includes), *EXITS_TO_RUNTIME]
        pch = precompiled_prelude(tu, flags, include_dirs, target)
        if profile:
            built = _compile_profiled(tu, flags, includes, cpp, kernel_label, pch, target)
        else:
            built = work / "kernel.so"
            _compile_library(tu, [*flags, "-shared", *link], includes, cpp, built,
                             kernel_label, pch, target)
        cachedir.publish(built, cached)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _runtime_beside() -> threading.Thread | None:
    """Starts building the runtime library in a thread, if this process has not got it
    yet: on a cold cache it then builds (in clang's processes) while this thread rewrites
    MLX's headers and compiles the kernel, on the second core."""
    if runtime_library.cache_info().currsize:
        return None

    def build() -> None:
        with contextlib.suppress(Exception):  # runtime_library() raises it again for the load
            runtime_library()

    thread = threading.Thread(target=build, name="mtwork-runtime-build", daemon=True)
    thread.start()
    return thread


def kernel_flags(math_mode: str, *, sanitize: bool = False, profile: bool = False,
                 lockstep: bool = False, target: Target = HOST,
                 msl_target: MslTarget = DEFAULT_MSL_TARGET) -> list[str]:
    """clang's flags for a kernel in `math_mode` built for `target` and `msl_target`:
    plain, sanitized or profiled (a plain build in `lockstep` traces its accesses)."""
    variant = (SANITIZE_FLAGS if sanitize else PROFILE_FLAGS if profile
               else (*NO_DEBUG_INFO, *(LOCKSTEP_FLAGS if lockstep else ())))
    return [*COMMON_FLAGS, *target.compile_flags(), *MATH_MODE_FLAGS[math_mode],
            *KERNEL_DEFINES, *msl_target.define_flags(), *KERNEL_FLAGS, *variant]


def kernel_includes(user_includes: Sequence[str] = ()) -> list[str]:
    """Where a kernel's includes are found: the shim, the author's folders (`-I` flags),
    then MLX's rewritten headers."""
    return ["-isystem", str(SHIM_DIR), *METAL_PREDECLARED, *user_includes,
            "-I", str(prelude_dir())]


def include_order(user_includes: Sequence[str]) -> tuple[str, ...]:
    """A key part for builds with author folders: they are searched before MLX's headers
    (builds keyed before that order was fixed are not reused)."""
    return ("author folders before MLX's headers",) if user_includes else ()


def precompiled_prelude(tu: Translation, flags: Sequence[str],
                        include_dirs: Sequence[Path] = (),
                        target: Target = HOST) -> Path | None:
    """The precompiled header `tu` can start from when compiled with `flags` (which name
    `target`): MLX's leading headers up to the first one an author's folder has its own
    copy of."""
    headers = precompiled.leading_headers(tu, SHIM_DIR, prelude_dir())
    shadowed = [i for i, h in enumerate(headers) if any((d / h).exists() for d in include_dirs)]
    headers = headers[: shadowed[0]] if shadowed else headers
    return precompiled.precompiled_header(headers, flags, kernel_includes(),
                                          shim_version(target))


def _compile_library(tu: Translation, flags: list[str], includes: list[str], cpp: Path,
                     built: Path, kernel_label: str, pch: Path | None, target: Target) -> None:
    """Compiles and links `cpp` into `built`, from the precompiled header when there is
    one (and without it when that header turns out unusable)."""
    result = precompiled.run_from(pch, [*flags, *includes, str(cpp), "-o", str(built)],
                                  lambda args: run_link(args, built, kernel_label, target))
    if result.returncode != 0:
        raise CompileError(kernel_label, clarify(author_message(result.stderr, tu, str(cpp))))


def _compile_profiled(tu: Translation, flags: list[str], includes: list[str], cpp: Path,
                      kernel_label: str, pch: Path | None, target: Target) -> Path:
    """The profiled variant, in two steps: clang writes the optimised IR, instrument.py
    counts its blocks and adds the counting calls, and clang compiles that IR (without
    optimising it again). Returns the folder holding kernel.so and table.json."""
    folder = cpp.parent / "profiled"
    folder.mkdir()
    ir = cpp.with_suffix(".ll")
    result = precompiled.run_from(pch, [*flags, "-S", "-emit-llvm", *includes, str(cpp),
                                        "-o", str(ir)], lambda args: run_clang(args, kernel_label))
    if result.returncode != 0:
        raise CompileError(kernel_label, clarify(author_message(result.stderr, tu, str(cpp))))
    text, table = instrument(ir.read_text(), shim_dir=str(SHIM_DIR),
                             place=author_place(tu.sources))
    counted = cpp.with_name("counted.ll")
    counted.write_text(text)
    # The coverage callbacks are in the IR already; defines and language flags do nothing.
    codegen = [f for f in flags if not f.startswith(("-fsanitize-coverage", "-D", "-std"))]
    library = folder / "kernel.so"
    result = run_link([*codegen, "-Xclang", "-disable-llvm-passes", "-shared",
                       *target.link_flags(), str(counted), "-o", str(library)], library,
                      kernel_label, target)
    if result.returncode != 0:
        raise CompileError(kernel_label, f"the profiled build failed:\n{result.stderr}")
    (folder / "table.json").write_text(json.dumps(table.to_json()))
    return folder
