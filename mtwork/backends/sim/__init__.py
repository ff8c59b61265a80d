"""The `sim` backend: MSL compiled with clang against mtwork's Metal shim, GPU threads
run as fibers on all CPU cores.

Its rooms, each using only those listed before it:

- `include/` (the shim of Metal's standard library) and `runtime/` (the C++ fiber runtime);
- `count/`: what the profiler counts, decided from clang's IR;
- `compile/`: a `Program` into a shared library (rewritten sources, launcher, clang);
- `run/`: the runtime over ctypes, a dispatch's memory, the isolated worker process;
- `report/`: what the runtime recorded as sanitizer findings and profiler counters;
- `engine/`: the fast engine (kernels with barriers as loops over threads);
- this module, `SimBackend`, over them all, with `profiled` (a profiled call: counters
  kept, counted on a sample or on every threadgroup, and the outputs); `worker` is the
  worker process's main.

A dispatch goes: `compile.sources.translation_unit` (the rewritten files and a launcher)
→ `compile.compiler.compile_kernel` (a shared library, cached on disk) → `run.runtime.load`
→ `run.memory.Memory` (the buffers and the launcher's pointer table) → `run.runtime.dispatch`
(the fiber runtime runs every threadgroup) → a `Completion`, with the sanitizer's report
from `report.findings` when it ran, or the profiler's `Counters` from `report.profiling`,
and the messages of a kernel that logs (`os_log`) from `report.logs`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...dispatch import Completion, Dispatch, Engine, Fresh, Program
from ...errors import KernelFault, KernelTimeout
from ...kernel_log import KernelLog, no_messages
from ...sanitizer import SanitizerError, SanitizerReport
from ...toolchain import clang
from . import profiled
from .builds import Builds, Compiled
from .compile import compiler
from .compile.sources import never_blocks
from .engine import Engines, FastLibrary, check_same
from .report import findings, logs
from .run import abi, runtime
from .run.isolation import Isolated, isolate_by_default
from .run.logbuffer import LogBuffer, RawLog, buffer_size, give, take
from .run.memory import Memory
from .run.shared import SharedBlock, SharedHeap, heap

__all__ = ["SimBackend"]

def _looks_barrier_free(program: Program) -> bool:
    """Whether the program's text never blocks (no barriers, SIMD-group functions or
    threadgroup memory); $MTWORK_SIM_BARRIER_FREE=0 turns the fast path off."""
    if os.environ.get("MTWORK_SIM_BARRIER_FREE", "1") == "0":
        return False
    return never_blocks(program)


# How long the worker outlives the last kernel object: long enough that code making a
# kernel per step (a test per kernel, a loop) keeps one worker.
IDLE_SECONDS = 5.0
# Why a call runs on the fiber engine whatever the kernel: its mode needs to know which
# thread runs.
_ON_FIBERS = "the sanitizer checks kernels on the fiber engine"


# Why a kernel that logged runs on fibers (a message of the plain loops or the fast engine
# stops the dispatch, which runs again on fibers: runtime/logging.cpp).
_LOGS = "it logs (os_log), and the fiber engine knows which thread writes each message"
# Why a lockstep kernel runs on fibers: the fast engine's region loops run a lane's code
# to the next synchronisation point before the next lane's.
_LOCKSTEP = ("its SIMD-groups rely on touching threadgroup memory in lockstep, which the "
             "fiber engine keeps (a step per access) and the fast engine's region loops do "
             "not")


class SimBackend:
    """The CPU emulator."""

    name = "sim"

    def __init__(self, *, checks: bool = True) -> None:
        self._builds = Builds(checks=checks)
        self._blocking: set[Path] = set()  # libraries that blocked on the fast path
        self._logging: set[Path] = set()  # libraries whose kernels logged on a fast path
        self._isolated: Isolated | None = None
        self._engines = Engines()

    def unavailable_reason(self) -> str | None:
        """Why the emulator cannot run here, or None when it can."""
        try:
            clang()
        except Exception as exc:  # noqa: BLE001 - report any cause
            return str(exc)
        if compiler.mlx_include_dir() is None:
            return "the installed mlx package has no Metal kernel headers"
        return None

    def compile(self, program: Program, *, sanitize: bool = False,
                profile: bool = False) -> Compiled:
        """Compiles `program` (once per translation unit and variant: plain, sanitized or
        profiled) after the Metal front end's check (`builds.Builds.compile`)."""
        return self._builds.compile(program, sanitize=sanitize, profile=profile)

    def compile_profiled(self, program: Program, plain_too: bool) -> Compiled:
        """The profiled build of `program`, with `plain_too` its plain build beside it."""
        return self._builds.compile_profiled(program, plain_too)

    def dispatch(self, program: Program, call: Dispatch) -> Completion:
        """Runs `program` over `call`'s grid and returns the buffers it wrote: in the
        worker process unless the call (or $MTWORK_ISOLATE=0) says in-process."""
        isolate = call.options.isolate
        if isolate is None:
            isolate = isolate_by_default()
        if not isolate:
            return self.dispatch_here(program, call)
        if self._isolated is None:
            self._isolated = Isolated()
        self._isolated.start()  # a new worker imports while this process compiles
        if call.options.profile:  # compile errors come here
            compiled = self.compile_profiled(program, profiled.plain_too(call))
        else:
            compiled = self._compiled_for(program, call)
        logging = call.options.log is not False and compiled.library.logs
        raw: list[RawLog | None] = [None]
        try:
            done = self._isolated.dispatch(program, call, buffer_size() if logging else 0,
                                           on_log=lambda log: raw.__setitem__(0, log))
        except KernelFault as fault:
            raise logs.told(fault, self._kernel_log(program, compiled, call, raw[0])) from None
        done.log = (self._kernel_log(program, compiled, call, raw[0]) if logging
                    else None if call.options.log is False else no_messages(program.label))
        return done

    def output_memory(self, call: Dispatch, sizes: list[int]) -> list[SharedBlock | None]:
        """Memory for the outputs of an operation of MLX's graph that the call writes
        without a copy: blocks of the memory shared with the worker for an isolated call
        (None, MLX's own memory, for one in this process, for empty outputs, and where
        the system has no shared memory to give: the output is then copied)."""
        isolate = call.options.isolate
        if isolate is None:
            isolate = isolate_by_default()
        if not isolate:
            return [None] * len(sizes)
        shared, lent = heap(), []
        for n in sizes:
            try:
                lent.append(shared.allocate(n) if n else None)
            except OSError:
                lent.append(None)
        return lent

    @property
    def shared_memory(self) -> SharedHeap:
        """The memory shared with the worker: its bytes in use (arrays, running calls),
        at the most so far, kept for reuse, and the limit of what is kept."""
        return heap()

    def idle(self) -> None:
        """No kernel is left: the worker ends after `IDLE_SECONDS` unless one is used."""
        if self._isolated is not None:
            self._isolated.close_when_idle(IDLE_SECONDS)

    @property
    def worker_pid(self) -> int | None:
        """The process id of the worker that runs kernels, while one runs."""
        return self._isolated.pid if self._isolated is not None else None

    def cancel(self) -> None:
        """Stops the kernel that is running, at once (from any thread): the worker process
        ends, or the dispatch in this process is stopped; either raises `KernelCancelled`."""
        if self._isolated is not None:
            self._isolated.cancel()
        runtime.cancel()

    def dispatch_here(self, program: Program, call: Dispatch,
                      place: Callable[[int, Fresh], np.ndarray] | None = None,
                      log_memory: np.ndarray | None = None) -> Completion:
        """Runs `program` in this process; `place(index, fresh)` gives the memory of a
        fresh buffer (default: a new array). The kernel's messages go to `log_memory`
        when given (the worker's part of the arena, which mtwork reads), else to a log of
        this process, read into the completion (and into a fault's error). A profiled
        call counts on the profiler's terms (`profiled`)."""
        if call.options.profile:
            return profiled.call(self, program, call, place, log_memory)
        compiled = self._compiled_for(program, call)  # compile errors come here
        if call.options.log is False:
            return self._dispatch(program, compiled, call, place, None)
        if not compiled.library.logs:  # as if logging did not exist
            done = self._dispatch(program, compiled, call, place, None)
            done.log = no_messages(program.label)
            return done
        if log_memory is not None:
            return self._dispatch(program, compiled, call, place, LogBuffer(log_memory))
        log = take(buffer_size())
        try:
            done = self._dispatch(program, compiled, call, place, log)
        except KernelFault as fault:
            raise logs.told(fault, self._kernel_log(program, compiled, call, log.read())) from None
        else:
            done.log = self._kernel_log(program, compiled, call, log.read())
            return done
        finally:
            give(log)

    def _compiled_for(self, program: Program, call: Dispatch) -> Compiled:
        return self.compile(program, sanitize=call.options.sanitize is not None)

    def _kernel_log(self, program: Program, compiled: Compiled, call: Dispatch,
                    raw: RawLog | None) -> KernelLog | None:
        """The dispatch's log in the author's terms (None: it kept none)."""
        if raw is None:
            return None
        return logs.kernel_log(raw, program.label, compiled.translation, call.geometry)

    def _engine_choice(self, program: Program, compiled: Compiled, call: Dispatch,
                       log: LogBuffer | None) -> tuple[bool, FastLibrary | None, str]:
        """Whether the call runs as plain loops, its fast library, and why on fibers."""
        sanitize = call.options.sanitize is not None
        if log is not None and compiled.library.path in self._logging:
            return False, None, _LOGS
        barrier_free = (not sanitize and _looks_barrier_free(program)
                        and compiled.library.path not in self._blocking)
        fast, why = self._fast_library(program, compiled, _ON_FIBERS if sanitize else None,
                                       barrier_free)
        return barrier_free, fast, why

    def _dispatch(self, program: Program, compiled: Compiled, call: Dispatch,
                  place: Callable[[int, Fresh], np.ndarray] | None,
                  log: LogBuffer | None) -> Completion:
        """One dispatch of `compiled` in this process, its messages in `log` (None: none
        kept)."""
        sanitize = call.options.sanitize is not None
        barrier_free, fast, why = self._engine_choice(program, compiled, call, log)
        saved = None
        while True:
            if log is not None:
                log.reset()
            memory, saved = self._memory(program, call, place, saved, barrier_free, fast)
            sanitizing = findings.describe_buffers(memory) if sanitize else None
            try:
                used = self.run_dispatch(program, fast.library if fast else compiled.library,
                                         memory, call, barrier_free or fast is not None,
                                         sanitizing, lockstep=compiled.lockstep and fast is None,
                                         log=log)
            except runtime.Logged:
                # A message from the plain loops or the fast engine: start again on fibers,
                # and keep this kernel there.
                self._logging.add(compiled.library.path)
                barrier_free, fast, why = False, None, _LOGS
                continue
            except runtime.NeedsFibers as stop:
                if fast is not None:  # the threads did not reach the same barrier
                    why = self._engines.needs_fibers(compiled.library.path, str(stop))
                    fast = None
                    continue
                # Blocking reached through a header or helper the text check cannot see:
                # start again with fresh buffers on the fast engine (or fibers), and
                # remember it for next time.
                self._blocking.add(compiled.library.path)
                barrier_free = False
                fast, why = self._fast_library(program, compiled, None, False)
                continue
            except KernelFault as fault:
                if (barrier_free or fast is not None) and not isinstance(fault, KernelTimeout):
                    # The fast paths do not track which thread runs; fault again on the
                    # general path to name it.
                    why = "the kernel faulted on the fast path; the fiber engine ran it again"
                    barrier_free, fast = False, None
                    continue
                self._raise_fault(program, compiled, call, sanitizing, memory, fault, log)
            if fast is not None and self._engines.comparing():
                done = self._compared(program, call, place, compiled, memory, saved, used)
            else:
                ran = Engine("fast") if fast else Engine("loops") if barrier_free else Engine(
                    "fibers", why)
                report = (None if sanitizing is None else
                          self._report(program, compiled, call, sanitizing, memory, log))
                done = Completion(memory.written(), report, used, ran)
            self._engines.record(program.label, done.engine)  # type: ignore[arg-type]
            return done

    def _memory(self, program: Program, call: Dispatch,
                place: Callable[[int, Fresh], np.ndarray] | None,
                saved: dict[int, np.ndarray] | None, barrier_free: bool,
                fast: FastLibrary | None) -> tuple[Memory, dict[int, np.ndarray] | None]:
        """An attempt's memory: the buffers as an earlier attempt found them (`saved`), or
        new ones, saved first when a fast path may have to run them again."""
        memory = Memory(program, call, place)
        if saved is not None:
            memory.restore(saved)
        elif barrier_free or fast is not None:
            saved = memory.snapshot(every=fast is not None and (
                fast.may_diverge or self._engines.comparing()))
        return memory, saved

    def _report(self, program: Program, compiled: Compiled, call: Dispatch,
                sanitizing: abi.Sanitizing, memory: Memory,
                log: LogBuffer | None) -> SanitizerReport:
        """The sanitizer's report of a dispatch that finished, its findings with the last
        messages of their threads."""
        report = findings.report(program.label, compiled.translation, compiled.library.path,
                                 sanitizing, memory)
        findings.quote_messages(report, self._kernel_log(program, compiled, call,
                                                         log.read() if log else None))
        return report

    def _fast_library(self, program: Program, compiled: Compiled, on_fibers: str | None,
                      barrier_free: bool) -> tuple[FastLibrary | None, str]:
        """The fast engine's library for a kernel that blocks, or why there is none
        (`on_fibers`: the call's mode needs the fiber engine, for this reason)."""
        if on_fibers is not None:
            return None, on_fibers
        if barrier_free:
            return None, ""
        if compiled.lockstep:
            return None, _LOCKSTEP
        return self._engines.library(program, compiled.library.path)

    def _compared(self, program: Program, call: Dispatch,
                  place: Callable[[int, Fresh], np.ndarray] | None, compiled: Compiled,
                  fast: Memory, saved: dict[int, np.ndarray] | None, used: int) -> Completion:
        """$MTWORK_SIM_ENGINE=compare: the dispatch run again on fibers, whose bytes must
        be those the fast engine wrote; the fiber engine's buffers are returned."""
        written = {i: a.copy() for i, a in fast.written().items()}
        memory = Memory(program, call, place)
        if saved is not None:
            memory.restore(saved)
        self.run_dispatch(program, compiled.library, memory, call, False, None,
                          lockstep=compiled.lockstep)
        check_same(program.label, written, memory.written())
        return Completion(memory.written(), None, used, Engine("fast", "compared with fibers"))

    def run_dispatch(self, program: Program, library: runtime.KernelLibrary,
                     memory: Memory, call: Dispatch, barrier_free: bool,
                     sanitizing: abi.Sanitizing | None, *, lockstep: bool = False,
                     groups: list[int] | None = None, log: LogBuffer | None = None) -> int:
        """Runs the dispatch on `library` (`lockstep`: a lockstep build on fibers; `groups`:
        only those threadgroups; the kernel's messages to `log`); time on the fiber engine
        (not barrier-free, not sanitized) counts toward building the kernel's fast
        library: the processor time it took over the runtime's workers (one per core), the
        time it takes on an idle machine, so that a busy one (notebooks run side by side)
        does not build libraries a quiet one would not."""
        geometry = call.geometry
        clamped = tuple(min(t, g) for t, g in zip(geometry.threadgroup, geometry.grid))
        start = time.process_time()
        used = runtime.dispatch(
            library, program.label, memory.table, geometry.grid, clamped,
            tg_static_bytes=memory.threadgroup_bytes,
            tg_memory_limit=program.msl_target.limits.threadgroup_memory,
            timeout=call.options.timeout,
            barrier_free=barrier_free, sanitizing=sanitizing, lockstep=lockstep,
            groups=groups, log=log.address if log is not None else None)
        if not barrier_free and sanitizing is None:
            workers = os.cpu_count() or 1  # the runtime's pool: one per online core
            self._engines.ran_on_fibers(library.path, (time.process_time() - start) / workers)
        return used

    def _raise_fault(self, program: Program, compiled: Compiled, call: Dispatch,
                     sanitizing: abi.Sanitizing | None, memory: Memory,
                     fault: KernelFault, log: LogBuffer | None) -> None:
        """Raises what a fault on the fiber engine means: a read of an unbound buffer (a
        TypeError naming it), the sanitizer's report, or the fault itself."""
        unbound = findings.unbound_read(program, call, fault)
        if unbound is not None:
            raise unbound from None
        if sanitizing is None:
            raise fault
        self._raise_with_report(program, compiled, call, sanitizing, memory, fault, log)

    def _raise_with_report(self, program: Program, compiled: Compiled, call: Dispatch,
                           sanitizing: abi.Sanitizing, memory: Memory,
                           fault: KernelFault, log: LogBuffer | None) -> None:
        """A sanitized kernel that faulted has no outputs: its report, with the fault
        unless a finding already stands for it, is the error."""
        report = findings.report(program.label, compiled.translation, compiled.library.path,
                                 sanitizing, memory, finished=False)
        finding = findings.fault_finding(program.label, fault)
        if finding is not None and not report.of_kind(finding.kind):
            report.findings.append(finding)
        findings.quote_messages(report, self._kernel_log(
            program, compiled, call, log.read() if log else None))
        raise SanitizerError(report) from fault
