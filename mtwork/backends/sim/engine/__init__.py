"""The fast engine: a kernel with barriers runs as loops over the threads of a group, one
region (the code between two barriers) at a time, instead of one fiber per thread.

`Engines` decides, per dispatch, which engine runs a kernel: the fast one where it has a
library for it and the kernel has not shown it needs fibers, else the fiber engine (the
reference, and the sanitizer's). It says which ran and, when it was not the fast one,
why (`Engine`). $MTWORK_SIM_ENGINE picks the policy: `auto` (the default), `fibers`
(always the reference), or `compare` (both, where the fast one can run, with their
written bytes required to be equal: the differential test runs the conformance suite
this way). $MTWORK_ENGINE_LOG names a file to which each dispatch appends one JSON line:
the kernel, the engine that ran it and why.
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
from .. import runtime
from .build import Built, build

__all__ = ["MODES", "EngineMismatch", "Engines", "FastLibrary", "check_same", "engine_mode"]

MODES = ("auto", "fibers", "compare")
FAST, FIBERS, LOOPS = "fast", "fibers", "loops"


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
    """$MTWORK_SIM_ENGINE: auto (default), fibers or compare."""
    mode = os.environ.get("MTWORK_SIM_ENGINE", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"MTWORK_SIM_ENGINE must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class Engines:
    """The fast engine's libraries, and what each kernel has shown."""

    def __init__(self) -> None:
        self._built: dict[Path, Built] = {}  # by the fiber library's path
        self._needs_fibers: dict[Path, str] = {}
        self._lock = threading.Lock()

    def library(self, program: Program, fibers: Path) -> tuple[FastLibrary | None, str]:
        """The fast library for `program` (whose fiber library is `fibers`), or None and
        the reason why the fiber engine runs it."""
        if engine_mode() == "fibers":
            return None, "$MTWORK_SIM_ENGINE=fibers"
        with self._lock:
            reason = self._needs_fibers.get(fibers)
            built = self._built.get(fibers)
        if reason is not None:
            return None, reason
        if built is None:
            built = build(program)
            with self._lock:
                self._built[fibers] = built
        if built.path is None:
            return None, f"the fast engine cannot run this kernel: {built.refused}"
        return FastLibrary.load(built.path), ""

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
