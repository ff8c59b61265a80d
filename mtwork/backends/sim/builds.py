"""The `sim` backend's builds of a program: checked against Metal's rules
(`compile.frontend`), compiled once per translation unit and variant (plain, sanitized,
profiled), and found again by program."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...dispatch import Program
from ...errors import CompileError
from .compile import compiler, frontend
from .compile.lockstep import needs_lockstep
from .compile.sources import translation_unit
from .count.instrument import Table
from .report import profiling
from .run import runtime

__all__ = ["Builds", "Compiled", "needs_lockstep_of"]

_PROGRAMS_KEPT = 1024
# Compiles a profiled call's plain build beside its profiled one (compile_profiled).
_BESIDE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtwork-compile")


def needs_lockstep_of(program: Program) -> bool:
    """Whether `program` runs with its SIMD-groups in lockstep through threadgroup memory
    (lockstep.py); $MTWORK_SIM_LOCKSTEP=0 turns it off (to measure what it costs)."""
    if os.environ.get("MTWORK_SIM_LOCKSTEP", "1") == "0":
        return False
    return needs_lockstep([program.sources.text, *(t for _, t in program.sources.files)])


@dataclass(frozen=True)
class Compiled:
    library: runtime.KernelLibrary
    translation: compiler.Translation
    table: Table | None = None  # profiled builds: what their blocks count
    lockstep: bool = False  # the library traces its accesses: run in lockstep


class Builds:
    """A backend's compiled programs."""

    def __init__(self, *, checks: bool = True) -> None:
        self._checks = checks  # the Metal front end's check before each compile
        self._compiled: dict[tuple, Compiled] = {}
        # The same, by program: a cached call skips writing its translation unit.
        self._by_program: dict[tuple[Program, str], Compiled] = {}
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.Lock] = {}

    def compile(self, program: Program, *, sanitize: bool = False,
                profile: bool = False) -> Compiled:
        """Compiles `program` (once per translation unit and variant: plain, sanitized or
        profiled) after the Metal front end's check (`compile.frontend`: a
        `MetalRuleError` for what Apple's compiler refuses); a `CompileError` quotes the
        author's files and lines."""
        variant = "profile" if profile else "sanitize" if sanitize else ""
        with self._lock:
            hit = self._by_program.get((program, variant))
        if hit is not None:
            return hit
        # The check runs beside the build (both are mostly clang's processes), and its
        # verdict comes first: a kernel that breaks a rule is refused even where the
        # emulator's C++ would build it.
        checking = frontend.Check(program) if self._checks else None
        try:
            compiled = self._library(program, variant, sanitize, profile)
        except CompileError:
            if checking is not None:
                checking.verdict()
            raise
        if checking is not None:
            checking.verdict()
        with self._lock:
            if len(self._by_program) > _PROGRAMS_KEPT:
                self._by_program.clear()
            self._by_program[(program, variant)] = compiled
        return compiled

    def _library(self, program: Program, variant: str, sanitize: bool,
                 profile: bool) -> Compiled:
        """The library of `program` in `variant` (once per translation unit)."""
        lockstep = needs_lockstep_of(program)
        tu, tree = translation_unit(program)
        key = (tu.text, program.math_mode, variant + "+lockstep" * lockstep, program.msl_target)
        with self._lock:
            hit = self._compiled.get(key)
            building = self._building.setdefault(key, threading.Lock())
        if hit is not None:
            return hit
        # One build of a translation unit at a time: threads compiling ahead and a call
        # asking for the same one wait for it (two would publish the same folder twice).
        with building:
            with self._lock:
                hit = self._compiled.get(key)
            if hit is not None:
                return hit
            try:
                compiled = self._build(program, tu, tree.include_dirs, sanitize, profile,
                                       lockstep)
            finally:
                with self._lock:
                    self._building.pop(key, None)
            with self._lock:
                self._compiled[key] = compiled
        return compiled

    @staticmethod
    def _build(program: Program, tu: compiler.Translation, include_dirs: Sequence[Path],
               sanitize: bool, profile: bool, lockstep: bool) -> Compiled:
        path = compiler.compile_kernel(tu, program.math_mode, program.label,
                                       include_dirs=include_dirs, sanitize=sanitize,
                                       profile=profile, lockstep=lockstep,
                                       msl_target=program.msl_target)
        table = profiling.load_table(path) if profile else None
        return Compiled(runtime.load(path), tu, table, lockstep)

    def compile_profiled(self, program: Program, plain_too: bool) -> Compiled:
        """The profiled build of `program`, and with `plain_too` its plain build (where a
        profiled call's outputs will come from a plain call) compiled beside it in a
        thread: two clang processes, on two cores, where one after the other took 1.2 s
        for a flash-attention setting. The thread is kept for the next one (starting one
        costs milliseconds on a busy machine)."""
        with self._lock:
            plain_here = (program, "") in self._by_program
        if not plain_too or plain_here:
            return self.compile(program, profile=True)
        beside = _BESIDE.submit(self.compile, program)
        try:
            return self.compile(program, profile=True)
        finally:
            with contextlib.suppress(Exception):  # the profiled build reports the error
                beside.result()
