"""The emulator builds for the Macs it is for, proved on Linux: the runtime and a
representative set of kernels (the self-test's own, MLX's, each family's, a sample of
llama.cpp's) are compiled and linked for aarch64-macos (Apple Silicon, tuned for the M1)
and x86_64-macos with the flags a Mac's build uses (`mtwork.host.Target`: SafeStack and
stack probes given to clang's front end, undefined symbols bound when the library
loads), in each variant a Mac runs: plain, sanitized, profiled and the fast engine's.

A link that allows undefined symbols proves nothing about loading, so each library's
symbol table is read back: a Mach-O dynamic library for the right CPU, whose every
undefined symbol the runtime or libSystem gives. The default run builds a representative
subset; ``-m slow`` builds every program for both Macs."""

from __future__ import annotations

import functools

import pytest

from mtwork.backends.sim.compile import compiler
from mtwork.backends.sim.compile.lockstep import needs_lockstep
from mtwork.backends.sim.compile.sources import never_blocks, translation_unit
from mtwork.backends.sim.engine.build import build as engine_build
from mtwork.dispatch import Program
from mtwork.host import MACOS_ARM64, MACOS_X86_64, Target
from tests.platforms import macho
from tests.platforms.programs import (
    LLAMA_CPP_SAMPLE,
    corpus,
    llama_cpp_program,
    record,
    recording,
)

CPU = {"aarch64": macho.CPU_ARM64, "x86_64": macho.CPU_X86_64}
# What the runtime gives kernels: the calls every build makes, and the exits kernels
# reach instead of the C library's.
RUNTIME_GIVES = ("_mtw_dispatch_start", "_mtw_threadgroup_barrier", "_mtw_simd_collective",
                 "___safestack_pointer_address", "_mtw_kernel_exit", "_mtw_kernel_quick_exit",
                 "___sanitizer_cov_load4", "_mtw_profile_block")
# Built in the default run, for Apple Silicon in every variant: a barrier,
# simdgroup_matrix, MLX's SIMD-group reductions, a family, and llama.cpp's lockstep flash
# attention; for an Intel Mac, plain builds of two of them.
DEFAULT = ("tree sum", "simdgroup_matrix", "MLX softmax_single_row", "flash_attention",
           "llama.cpp fa_vec_f16.metal")
DEFAULT_X86_64 = ("tree sum", "MLX softmax_single_row")


@pytest.fixture(scope="module")
def programs():
    """The program of each named kernel, recorded (or loaded) when first asked for."""
    found: dict[str, Program] = {}
    cases = corpus()
    llama_cpp = {f"llama.cpp {file}": (file, name) for file, name in LLAMA_CPP_SAMPLE}
    with recording() as recorder:

        def program(name: str) -> Program:
            if name not in found:
                found[name] = (llama_cpp_program(*llama_cpp[name]) if name in llama_cpp
                               else record(recorder, cases[name])[0].program)
            return found[name]

        program.names = [*cases, *llama_cpp]  # type: ignore[attr-defined]
        yield program


def _mac_library(path, target: Target, runtime: macho.MachO) -> None:
    lib = macho.read(path)
    assert lib.cpu == CPU[target.cpu] and lib.filetype == macho.MH_DYLIB, path
    missing = macho.unresolved(lib, runtime)
    assert not missing, f"{path.name} needs symbols nothing gives on macOS: {sorted(missing)}"


@functools.cache
def runtime_of(target: Target) -> macho.MachO:
    return macho.read(compiler.runtime_library(target))


@pytest.fixture(scope="module", params=[MACOS_ARM64, MACOS_X86_64], ids=lambda t: t.name)
def target_runtime(request) -> tuple[Target, macho.MachO]:
    return request.param, runtime_of(request.param)


def test_the_runtime_links_for_macos_and_gives_what_kernels_call(target_runtime) -> None:
    target, runtime = target_runtime
    assert runtime.cpu == CPU[target.cpu] and runtime.filetype == macho.MH_DYLIB
    assert set(RUNTIME_GIVES) <= runtime.defined
    assert not macho.unresolved(runtime), "the runtime needs symbols libSystem lacks"


def _builds(program: Program, target: Target, runtime: macho.MachO, variants: tuple[str, ...]
            ) -> None:
    lockstep = needs_lockstep([program.sources.text, *(t for _, t in program.sources.files)])
    tu, tree = translation_unit(program)
    for variant in variants:
        if variant == "engine":
            if never_blocks(program) or lockstep:
                continue  # sim runs it as plain loops, or on fibers in lockstep
            built = engine_build(program, target)
            host = engine_build(program)
            assert (built.path is None) == (host.path is None), built.refused or host.refused
            if built.path is not None:
                _mac_library(built.path, target, runtime)
            continue
        path = compiler.compile_kernel(tu, program.math_mode, program.label,
                                       include_dirs=tree.include_dirs, target=target,
                                       sanitize=variant == "sanitize",
                                       profile=variant == "profile",
                                       lockstep=lockstep and variant == "plain")
        _mac_library(path, target, runtime)


@pytest.mark.parametrize(("target", "name"),
                         [*((MACOS_ARM64, n) for n in DEFAULT),
                          *((MACOS_X86_64, n) for n in DEFAULT_X86_64)],
                         ids=lambda x: x.name if isinstance(x, Target) else x)
def test_kernels_build_and_link_for_macos(programs, target, name) -> None:
    variants = (("plain", "sanitize", "profile", "engine") if target == MACOS_ARM64
                else ("plain",))
    _builds(programs(name), target, runtime_of(target), variants)


@pytest.mark.slow
def test_every_program_builds_and_links_for_macos(programs, target_runtime) -> None:
    target, runtime = target_runtime
    for name in programs.names:
        _builds(programs(name), target, runtime, ("plain", "sanitize", "profile", "engine"))
