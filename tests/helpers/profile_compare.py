"""A pytest plugin for tests/test_profile_sampling.py's child interpreter: every dispatch
the tests make (in this process: $MTWORK_ISOLATE=0) is first profiled twice, on a sample
of its threadgroups (of two or more) and on every threadgroup, nothing taken from counters
kept earlier,
and one JSON line per dispatch goes to $MTWORK_PROFILE_COMPARE_LOG: the kernel, its
threadgroups, how many the sample counted (or why it counted every one) and whether the
two counts are the same (the fields that differ when not). The bound buffers a kernel
may write are put back after each count, so the test's own dispatch sees its inputs.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

from mtwork.backends.sim import SimBackend, profiled
from mtwork.backends.sim.report import kept, sampling
from mtwork.backends.sim.run.memory import Memory
from mtwork.errors import EmulatorUnavailable, KernelFault


def _counted(backend, real, program, call, how: str):
    os.environ["MTWORK_PROFILER"] = how
    memory = Memory(program, call)
    saved = memory.snapshot(every=True)
    try:
        return real(backend, program, replace(call, options=replace(call.options,
                                                                    profile=True))).counters
    finally:
        memory.restore(saved)
        os.environ.pop("MTWORK_PROFILER", None)


def _compare(backend, real, program, call) -> dict:
    sampled: dict = {}
    whole = sampling.whole

    def spied(groups, count, **options):
        out = whole(groups, count, **options)
        sampled.update(counted=out[1], reason=out[2])
        return out

    sampling.whole = spied
    row = {"kernel": program.label, "groups": math.prod(call.geometry.threadgroups)}
    try:
        exact = _counted(backend, real, program, call, "exact")
        by_sample = _counted(backend, real, program, call, "sampled")
    except (EmulatorUnavailable, KernelFault) as exc:
        return {**row, "skipped": f"{type(exc).__name__}: {exc}"[:200]}
    finally:
        sampling.whole = whole
    a, b = exact.to_dict(), by_sample.to_dict()
    return {**row, **sampled, "same": a == b, "differ": sorted(k for k in a if a[k] != b[k])}


def pytest_configure(config) -> None:
    log = os.environ["MTWORK_PROFILE_COMPARE_LOG"]
    real = SimBackend.dispatch_here
    kept.kept = lambda name: None  # count, do not recall
    kept.keep = lambda name, counters: None
    # the tests' grids are small: sample from two threadgroups on, so that the sample's
    # way of counting is what is compared with the exact one
    profiled.SAMPLED_FROM = 2

    comparing = []  # a profiled call's own plain call is not compared again

    def dispatch_here(self, program, call, place=None, log_memory=None):
        if call.options.sanitize is None and not call.options.profile and not comparing:
            comparing.append(True)
            try:
                row = _compare(self, real, program, call)
            finally:
                comparing.clear()
            with open(log, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
        return real(self, program, call, place, log_memory)

    SimBackend.dispatch_here = dispatch_here
