"""A profiled call on `sim`: its counters and its outputs.

The counters are, in this order: those kept from an earlier count of the same kernel,
geometry and argument values (`report.kept`); else a count of a sample of the call's
threadgroups, each apart, where the sample stands for all of them (`report.sampling`,
the same counts as counting every threadgroup); else a count of every threadgroup.
Where the count ran every threadgroup its outputs are the call's; else they come from a
plain call (the fast engine's, where the kernel runs on it). $MTWORK_PROFILER=exact
counts every threadgroup.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ...dispatch import Completion, Dispatch, Engine, Fresh, Program
from ...gpu.counters import Counters
from .report import kept, profiling, sampling
from .run.memory import Memory

if TYPE_CHECKING:  # the backend calls this module; it is only a type here
    from . import SimBackend
    from .builds import Compiled

__all__ = ["MODES", "ON_FIBERS", "SAMPLED_FROM", "call", "mode", "plain_too"]

MODES = ("sampled", "exact")
ON_FIBERS = "the profiler counts kernels on the fiber engine"
# The profiler counts a sample of a dispatch's threadgroups from this many on; fewer are
# all counted, which costs little more than a sample's checks would.
SAMPLED_FROM = 24
_RANGES_PER_GROUP = 1 << 20  # device access ranges a sampled threadgroup may record
# A sample gives up past a twelfth of the threadgroups (at least _FEWEST_BUDGET: a box of
# three dimensions checked, and where it failed; at most _MOST_SAMPLED), and counting every
# one then costs at most a twelfth more than it would have at once (a third on the
# smallest grids). Counting slice by slice, it may take a third of them.
_FEWEST_BUDGET = 8
_MOST_SAMPLED = 256


def mode() -> str:
    """$MTWORK_PROFILER: `sampled` (the default) or `exact` (every threadgroup counted)."""
    how = os.environ.get("MTWORK_PROFILER", "sampled").strip().lower() or "sampled"
    if how not in MODES:
        raise ValueError(f"MTWORK_PROFILER must be one of {', '.join(MODES)}, got {how!r}")
    return how


def plain_too(dispatch: Dispatch) -> bool:
    """Whether a profiled call is likely to take its outputs from a plain call (a sample
    is counted: its grid is large enough), so its plain build is wanted beside."""
    return mode() == "sampled" and math.prod(dispatch.geometry.threadgroups) >= SAMPLED_FROM


def call(backend: SimBackend, program: Program, dispatch: Dispatch,
         place: Callable[[int, Fresh], np.ndarray] | None,
         log_memory: np.ndarray | None = None) -> Completion:
    """The profiled call of `program` over `dispatch` on `backend`, in this process. Its
    outputs, and the kernel's messages (to `log_memory` where given), come from a plain
    call where the counters are sampled or kept; a whole count keeps no log."""
    compiled = backend.compile_profiled(program, plain_too(dispatch))
    how = mode()
    name = kept.key(compiled.library.path, program.label, dispatch,
                    line_bytes=profiling.line_bytes(), how=how)
    counters = kept.kept(name)
    if counters is None and how == "sampled":
        counters = _sampled(backend, program, compiled, dispatch)
        if counters is not None:
            kept.keep(name, counters)
    if counters is None:
        done = _exact(backend, program, compiled, Memory(program, dispatch, place), dispatch)
        assert done.counters is not None
        kept.keep(name, done.counters)
        return done
    plain = replace(dispatch, options=replace(dispatch.options, profile=False))
    done = backend.dispatch_here(program, plain, place, log_memory)
    done.counters = counters
    return done


def _sampled(backend: SimBackend, program: Program, compiled: Compiled, dispatch: Dispatch
             ) -> Counters | None:
    """The counters of a dispatch from a sample of its threadgroups, counted on memory of
    their own (the bound buffers they may write are put back), or None where the sample
    cannot stand for the whole."""
    assert compiled.table is not None
    geometry = dispatch.geometry
    total = math.prod(geometry.threadgroups)
    if total < SAMPLED_FROM:
        return None
    memory = Memory(program, dispatch)
    saved = memory.snapshot()
    used = 0

    def count(groups: list[int], checked: list[bool]) -> list[profiling.Profiled]:
        nonlocal used
        with profiling.counting(compiled.library, compiled.table, memory, geometry,
                                ranges=_RANGES_PER_GROUP * len(groups), apart=groups,
                                checked=checked) as counted:
            used = max(used, backend.run_dispatch(program, compiled.library, memory, dispatch,
                                                  False, None, lockstep=compiled.lockstep,
                                                  groups=groups))
        return counted

    try:
        whole, _, _ = sampling.whole(
            geometry.threadgroups, count,
            budget=min(_MOST_SAMPLED, max(_FEWEST_BUDGET, total // 12)),
            line_bytes=profiling.line_bytes())
    finally:
        memory.restore(saved)
    if whole is None:
        return None
    return profiling.counters(program.label, compiled.translation.sources,
                              compiled.library.path, compiled.table, whole, geometry, used)


def _exact(backend: SimBackend, program: Program, compiled: Compiled, memory: Memory,
           dispatch: Dispatch) -> Completion:
    """One dispatch with the profiler counting every threadgroup (on fibers: it needs to
    know which thread runs)."""
    assert compiled.table is not None
    with profiling.counting(compiled.library, compiled.table, memory,
                            dispatch.geometry) as counted:
        used = backend.run_dispatch(program, compiled.library, memory, dispatch, False, None,
                                    lockstep=compiled.lockstep)
    counters = profiling.counters(program.label, compiled.translation.sources,
                                  compiled.library.path, compiled.table, counted[0],
                                  dispatch.geometry, used)
    return Completion(memory.written(), None, used, Engine("fibers", ON_FIBERS), counters)
