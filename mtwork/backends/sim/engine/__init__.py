"""The fast engine: a kernel with barriers runs as loops over the threads of a group, one
region (the code between two barriers) at a time, instead of one fiber per thread.

`Engines` decides, per dispatch, which engine runs a kernel: the fast one where it has a
library for it and the kernel has not shown it needs fibers, else the fiber engine (the
reference, and the sanitizer's). It says which ran and, when it was not the fast one,
why (`Engine`). $MTWORK_SIM_ENGINE picks the policy: `auto` (the default: once a kernel's
calls have taken `BUILD_AFTER_SECONDS` on fibers, its fast library is built in a thread
of its own while the calls go on on fibers, and the first call after the build runs
fast; small dispatches such as tests' never reach it), `fast` (built at the first call,
which waits for it), `fibers` (always the reference), or `compare` (both at the first
call, where the fast one can run, with their written bytes required to be equal: the
differential test runs the conformance suite this way). $MTWORK_ENGINE_LOG names a file
to which each dispatch appends one JSON line: the kernel, the engine that ran it and why.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....dispatch import Engine, Program
from ..run import runtime
from .build import Built, build, cached

__all__ = ["MODES", "EngineMismatch", "Engines", "FastLibrary", "check_same", "engine_mode"]

MODES = ("auto", "fast", "fibers", "compare")
# Seconds of a kernel's calls on fibers after which `auto` starts building its fast
# library: about what the build costs (three clang steps and the pass, 0.4 to 0.9 s of one
# core for the benchmarks' kernels, more beside calls that use both cores), the rent or
# buy rule. The build runs beside the calls, which do not wait for it. Sooner costs the
# kernels that are called a few times, such as a sweep's configurations: the gated-delta
# notebook's WY sweep (16 kernels, a few calls of 0.1 to 0.2 s each) took 46.5 s with the
# builds starting after 0.1 s, 36.3 s after 1 s. A long loop of one kernel is fast after
# its first seconds either way; `MTWORK_SIM_ENGINE=fast` builds at the first call.
BUILD_AFTER_SECONDS = 1.0
FAST, FIBERS, LOOPS = "fast", "fibers", "loops"
_BUILDING = ("the fast engine's library for this kernel is being built; its calls run on "
             "fibers until it is ready")


@dataclass(frozen=True)
class FastLibrary:
    """A kernel's library for the fast engine; `may_diverge`: its threads may not all reach
    the same barrier, so a dispatch may have to start again on fibers."""

    library: runtime.KernelLibrary
    may_diverge: bool

    @classmethod
    def load(cls, path: Path) -> FastLibrary:
        library = runtime.load(path)
        flag = ctypes.c_int.in_dll(library.handle, "mtw_engine_may_diverge").value
        return cls(library, bool(flag))


class EngineMismatch(AssertionError):
    """The fast engine and the fiber engine wrote different bytes (compare mode)."""


def engine_mode() -> str:
    """$MTWORK_SIM_ENGINE: auto (default), fast, fibers or compare."""
    mode = os.environ.get("MTWORK_SIM_ENGINE", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"MTWORK_SIM_ENGINE must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class Engines:
    """The fast engine's libraries, and what each kernel has shown."""

    def __init__(self) -> None:
        self._built: dict[Path, Built] = {}  # by the fiber library's path
        self._needs_fibers: dict[Path, str] = {}
        self._fiber_seconds: dict[Path, float] = {}  # time each kernel spent on fibers
        self._building: dict[Path, threading.Thread] = {}  # builds under way (`auto`)
        self._looked_up: set[Path] = set()  # kernels whose fast library was looked for
        self._lock = threading.Lock()

    def library(self, program: Program, fibers: Path) -> tuple[FastLibrary | None, str]:
        """The fast library for `program` (whose fiber library is `fibers`), or None and
        the reason why the fiber engine runs it."""
        mode = engine_mode()
        if mode == "fibers":
            return None, "$MTWORK_SIM_ENGINE=fibers"
        with self._lock:
            reason = self._needs_fibers.get(fibers)
            built = self._built.get(fibers)
            spent = self._fiber_seconds.get(fibers, 0.0)
        if reason is not None:
            return None, reason
        if built is None:
            built = self._cached(program, fibers)
        if built is None and mode == "auto":
            return None, self._build_beside(program, fibers, spent)
        if built is None:
            built = build(program)
            with self._lock:
                self._built[fibers] = built
        if built.path is None:
            return None, f"the fast engine cannot run this kernel: {built.refused}"
        return FastLibrary.load(built.path), ""

    def _cached(self, program: Program, fibers: Path) -> Built | None:
        """The kernel's fast library (or its refusal) where the cache has it from an
        earlier build, looked up once per kernel: from its first call on."""
        with self._lock:
            if fibers in self._looked_up:
                return None
            self._looked_up.add(fibers)
        found = cached(program)
        if found is not None:
            with self._lock:
                self._built[fibers] = found
        return found

    def _build_beside(self, program: Program, fibers: Path, spent: float) -> str:
        """`auto`: starts the build of `program`'s fast library in a thread of its own once
        its calls have taken BUILD_AFTER_SECONDS on fibers; why this call runs on fibers."""
        with self._lock:
            if fibers in self._building:
                return _BUILDING
            if spent < BUILD_AFTER_SECONDS:
                return (f"the fast engine is built for a kernel once its calls have taken "
                        f"{BUILD_AFTER_SECONDS:g} s on fibers ($MTWORK_SIM_ENGINE=fast "
                        "builds it at the first call)")
            thread = threading.Thread(target=self._build_in_thread, args=(program, fibers),
                                      name=f"mtwork-engine-build-{program.label}")
            self._building[fibers] = thread
        thread.start()
        return _BUILDING

    def _build_in_thread(self, program: Program, fibers: Path) -> None:
        try:
            built = build(program)
        except Exception as exc:  # noqa: BLE001 - the kernel stays on fibers, saying why
            built = Built(None, f"its build failed: {exc}")
        with self._lock:
            self._built[fibers] = built
            del self._building[fibers]

    def wait_for_builds(self, timeout: float | None = None) -> None:
        """Waits for the fast libraries being built in the background (`auto`)."""
        with self._lock:
            threads = list(self._building.values())
        for thread in threads:
            thread.join(timeout)

    def ran_on_fibers(self, fibers: Path, seconds: float) -> None:
        """Counts the time a call of the kernel of `fibers` took on the fiber engine."""
        with self._lock:
            self._fiber_seconds[fibers] = self._fiber_seconds.get(fibers, 0.0) + seconds

    def needs_fibers(self, fibers: Path, reason: str) -> str:
        """Remembers that the kernel of `fibers` must run on fibers; returns the reason as
        a user reads it."""
        note = f"the fast engine found that {reason}; it runs on fibers from now on"
        with self._lock:
            self._needs_fibers[fibers] = note
        return note

    @staticmethod
    def comparing() -> bool:
        return engine_mode() == "compare"

    @staticmethod
    def record(kernel: str, engine: Engine) -> None:
        """Appends which engine ran `kernel` to $MTWORK_ENGINE_LOG, if set."""
        path = os.environ.get("MTWORK_ENGINE_LOG")
        if path:
            line = json.dumps({"kernel": kernel, "engine": engine.name,
                               "reason": engine.reason})
            with open(path, "a", encoding="utf-8") as log:
                log.write(line + "\n")


def check_same(label: str, fast: Mapping[int, np.ndarray],
               fibers: Mapping[int, np.ndarray]) -> None:
    """Raises EngineMismatch unless both engines wrote the same bytes to every buffer."""
    for index, reference in fibers.items():
        got = fast[index]
        if got.tobytes() == reference.tobytes():
            continue
        width = max(reference.itemsize, 1)
        a = np.frombuffer(got.tobytes(), np.uint8).reshape(-1, width)
        b = np.frombuffer(reference.tobytes(), np.uint8).reshape(-1, width)
        differ = np.flatnonzero((a != b).any(axis=1))
        first = int(differ[0])
        raise EngineMismatch(
            f"`{label}`: buffer {index} differs between the fast engine and the fiber engine "
            f"in {differ.size} of {b.shape[0]} elements, first at {first} (fast "
            f"{got.reshape(-1)[first]!r}, fibers {reference.reshape(-1)[first]!r})")
