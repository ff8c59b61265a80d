"""Builds a kernel library for the fast engine, cached like the fiber engine's.

The engine's translation unit is the fiber engine's (defines, prelude, the author's
files) with its own launcher: a per-thread entry `mtw_engine_thread(g, buffers, i, x,
y, z)` calling the kernel, and include/mtw_engine.h. Then:

1. clang emits its IR as the -O2 front end makes it, before any optimization;
2. every function defined in it is marked `alwaysinline`;
3. clang's -O1 pipeline inlines everything into the per-thread entry and puts it in SSA
   form (barriers stay calls: they are `convergent` and `nomerge`);
4. the engine's pass (`transform`) cuts it into regions and writes the driver;
5. clang's -O3 pipeline compiles that (the loops over threads vectorize) into a library.

A kernel the pass cannot take is remembered in the cache as refused, with the reason.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .... import cachedir
from ....cachedir import cache_dir
from ....dispatch import Program
from ....host import HOST, Target
from ....msl.target import MslTarget
from ....toolchain import run_clang
from ..compile import compiler, precompiled
from ..compile.launcher import LaunchParam, call_arguments
from ..compile.linking import run_link
from ..compile.sources import translation_unit
from ..compile.translation import Translation
from .ir import IRError
from .transform import transform

__all__ = ["Built", "build", "cached"]

ENGINE_DIR = Path(__file__).parent
# The front end's flags (its precompiled header is built with them), then its output.
_FRONT_END_FLAGS = ("-O2", "-Xclang", "-disable-llvm-passes", "-g0")
_FRONT_END = (*_FRONT_END_FLAGS, "-emit-llvm", "-S")
_QUIET = ("-Wno-unused-command-line-argument", "-Wno-override-module")


@dataclass(frozen=True)
class Built:
    """A library for the fast engine, or the reason there is none."""

    path: Path | None
    refused: str | None = None


def engine_launcher(function: str, params: Sequence[LaunchParam]) -> str:
    """The engine's launcher: one thread, its index and position given."""
    return f"""
#include "mtw_engine.h"
extern "C" __attribute__((visibility("default")))
void mtw_engine_thread(mtw_group* g, void* const* b, uint32_t i, uint32_t x, uint32_t y,
                       uint32_t z) {{
  const mtw_engine_local local = {{x, y, z}};
  {function}(
          {call_arguments(params)});
}}
"""


@cache
def _engine_version() -> str:
    h = hashlib.sha256()
    for f in sorted(ENGINE_DIR.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _flags(math_mode: str, target: Target, msl_target: MslTarget) -> list[str]:
    common = [f for f in compiler.COMMON_FLAGS if f != "-O2"]
    # 4-byte alignment for vector accesses through pointers, as the fiber engine's build
    # (compiler.KERNEL_FLAGS says why); no SafeStack: the engine runs threads as loops.
    return [*common, *target.compile_flags(), *compiler.MATH_MODE_FLAGS[math_mode],
            *compiler.KERNEL_DEFINES, *msl_target.define_flags(),
            f"-fmax-type-align={compiler.POINTER_ALIGN}"]


def _always_inline(text: str) -> str:
    """Every function the module defines marked `alwaysinline` (and never `noinline`)."""
    groups = set()
    for line in text.splitlines():
        if line.startswith("define "):
            tail = line[line.rindex(")"):]
            groups.update(re.findall(r"#(\d+)", tail))

    def mark(m: re.Match[str]) -> str:
        body = re.sub(r"\b(?:noinline|optnone)\b ?", "", m.group(2))
        if "alwaysinline" not in body:
            body = "alwaysinline " + body
        return f"attributes #{m.group(1)} = {{ {body}}}"

    pattern = re.compile(r"^attributes #(\d+) = \{ (.*)\}$", re.M)
    return pattern.sub(lambda m: mark(m) if m.group(1) in groups else m.group(0), text)


def _run(args: list[str], label: str) -> str | None:
    """Runs clang; the error text when it fails."""
    result = run_clang(args, label)
    return None if result.returncode == 0 else result.stderr[-2000:]


def _compile(work: Path, tu: Translation, program: Program, include_dirs: tuple[Path, ...],
             target: Target) -> tuple[Path | None, str | None]:
    label = program.label
    flags = _flags(program.math_mode, target, program.msl_target)
    source, front, inlined, transformed = (work / n for n in (
        "kernel.cpp", "front.ll", "inlined.ll", "engine.ll"))
    source.write_text(tu.text)
    pch = compiler.precompiled_prelude(tu, [*flags, *_FRONT_END_FLAGS], include_dirs, target)
    includes = compiler.kernel_includes([arg for d in include_dirs for arg in ("-I", str(d))])
    result = precompiled.run_from(pch, [*flags, *_FRONT_END, *includes,
                                        *compiler.EXITS_TO_RUNTIME, str(source), "-o",
                                        str(front)],
                                  lambda args: run_clang(args, label))
    error = None if result.returncode == 0 else result.stderr[-2000:]
    if error:
        return None, f"clang could not build the engine's translation unit: {error}"
    (work / "marked.ll").write_text(_always_inline(front.read_text()))
    error = _run([*flags, *_QUIET, "-O1", "-emit-llvm", "-S", str(work / "marked.ll"),
                  "-o", str(inlined)], label)
    if error:
        return None, f"clang could not inline the kernel: {error}"
    try:
        result = transform(inlined.read_text())
    except IRError as exc:
        return None, str(exc)
    transformed.write_text(result.text)
    library = work / "kernel.so"
    linked = run_link([*flags, *_QUIET, "-O3", "-shared", *target.link_flags(),
                       str(transformed), "-o", str(library)], library, label, target)
    error = None if linked.returncode == 0 else linked.stderr[-2000:]
    if error:
        return None, f"clang could not compile the engine's IR: {error}"
    return library, None


def _places(program: Program, target: Target
            ) -> tuple[Translation, tuple[Path, ...], Path, Path]:
    """The engine's translation unit for `program` on `target`, its include folders, and
    where its library (or the note of its refusal) is cached."""
    tu, tree = translation_unit(program, launcher=engine_launcher)
    includes = [arg for d in tree.include_dirs for arg in ("-I", str(d))]
    # Keyed as the fiber engine's library is: by the prelude's folder too (MLX's headers
    # and the rewrites applied to them).
    key = compiler.digest(tu.text, " ".join([*_flags(program.math_mode, target,
                                                     program.msl_target),
                                             *compiler.EXITS_TO_RUNTIME]),
                          compiler.shim_version(target), _engine_version(),
                          str(compiler.prelude_dir()), *includes,
                          *compiler.include_order(includes))
    folder = cache_dir() / "engine"
    return tu, tuple(tree.include_dirs), folder / f"{key}.so", folder / f"{key}.refused"


def _from_cache(library: Path, refusal: Path) -> Built | None:
    if compiler.reusable(library):
        return Built(library)
    if compiler.reusable(refusal):
        return Built(None, refusal.read_text())
    return None


def cached(program: Program, target: Target = HOST) -> Built | None:
    """The fast engine's library for `program` (or its refusal) where the cache has it,
    else None: nothing is built."""
    _, _, library, refusal = _places(program, target)
    return _from_cache(library, refusal)


def build(program: Program, target: Target = HOST) -> Built:
    """The fast engine's library for `program` (built once, then from the cache), for
    `target` (another machine than this one: to prove it builds)."""
    tu, include_dirs, library, refusal = _places(program, target)
    found = _from_cache(library, refusal)
    if found is not None:
        return found
    with cachedir.build_lock(library):  # another process building it: wait, then reuse
        found = _from_cache(library, refusal)
        return found if found is not None else _build(tu, program, include_dirs, library,
                                                      refusal, target)


def _build(tu: Translation, program: Program, include_dirs: tuple[Path, ...], library: Path,
           refusal: Path, target: Target) -> Built:
    library.parent.mkdir(parents=True, exist_ok=True)
    work = cachedir.work_dir()
    try:
        built, reason = _compile(work, tu, program, include_dirs, target)
        if built is None:
            note = work / "refused"
            note.write_text(reason or "")
            cachedir.publish(note, refusal)
            return Built(None, reason)
        cachedir.publish(built, library)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Built(library)
