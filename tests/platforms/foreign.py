"""mtwork's dispatches on another machine's build: a call recorded here (its `Program` and
`Dispatch`, through a backend that records what reaches sim) is built for a `Target` with
mtwork's own compile paths, written as a plan for `driver.c` (the launcher's pointer
table, every buffer's bytes, the geometry) and run by the driver built for that target:
natively for this machine, under qemu-user for arm64 Linux (Debian's qemu-user and
libc6-arm64-cross). What each run leaves in the buffers comes back for comparison.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from mtwork.backends.sim import SimBackend
from mtwork.backends.sim.compile import compiler
from mtwork.backends.sim.compile.lockstep import needs_lockstep
from mtwork.backends.sim.compile.sources import (
    THREADGROUP_SLOT_BASE,
    never_blocks,
    translation_unit,
)
from mtwork.backends.sim.engine.build import build as engine_build
from mtwork.backends.sim.run.memory import Memory
from mtwork.buffers import byte_span
from mtwork.dispatch import Completion, Dispatch, Program
from mtwork.host import HOST, LINUX_ARM64, Target
from mtwork.toolchain import run_clang

DRIVER = Path(__file__).with_name("driver.c")
ARM64_SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's libc6-arm64-cross


def qemu_missing() -> str | None:
    """Why arm64 code cannot run here, or None."""
    if shutil.which("qemu-aarch64") is None:
        return "qemu-aarch64 is not installed (Debian: apt-get install qemu-user)"
    if not (ARM64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return "arm64 glibc is not installed (Debian: apt-get install libc6-arm64-cross)"
    return None


# --- recording calls ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    program: Program
    call: Dispatch
    completion: Completion | None  # None: the dispatch failed here


class Recorder:
    """A backend that runs on sim, in this process, and keeps every call."""

    name = "recorded"

    def __init__(self) -> None:
        self.sim = SimBackend()
        self.calls: list[Recorded] = []

    def unavailable_reason(self) -> str | None:
        return self.sim.unavailable_reason()

    def compile(self, program: Program, *, sanitize: bool = False, profile: bool = False):
        return self.sim.compile(program, sanitize=sanitize, profile=profile)

    def dispatch(self, program: Program, call: Dispatch) -> Completion:
        here = dataclasses.replace(call, options=dataclasses.replace(call.options,
                                                                     isolate=False))
        try:
            done = self.sim.dispatch_here(program, here)
        except Exception:
            self.calls.append(Recorded(program, here, None))
            raise
        self.calls.append(Recorded(program, here, done))
        return done

    def cancel(self) -> None:
        self.sim.cancel()


# --- building ----------------------------------------------------------------------------------


@cache
def driver(target: Target, folder: Path) -> Path:
    """`driver.c` built for `target` (in `folder`)."""
    out = folder / f"driver-{target.name}"
    args = [*target.compile_flags(), "-O1", "-nostdlib++", "-I", str(compiler.RUNTIME_DIR),
            "-isystem", str(compiler.SHIM_DIR), "-x", "c", str(DRIVER), "-x", "none",
            "-ldl", "-o", str(out)]
    done = run_clang(args, "the test driver")
    if done.returncode != 0:
        raise RuntimeError(f"building the driver for {target.name} failed:\n{done.stderr}")
    return out


@dataclass(frozen=True)
class Variant:
    """One way sim runs a call: the library, its entry and how the runtime runs it."""

    engine: str  # "fibers", "loops" or "fast"
    library: Path
    entry: str
    barrier_free: bool
    lockstep: bool


def variants(program: Program, target: Target) -> list[Variant]:
    """The libraries sim would run `program` with, built for `target`: on fibers, and as
    plain loops (a kernel that never blocks) or on the fast engine (one that does, when
    the engine takes it)."""
    lockstep = needs_lockstep([program.sources.text, *(t for _, t in program.sources.files)])
    tu, tree = translation_unit(program)
    library = compiler.compile_kernel(tu, program.math_mode, program.label,
                                      include_dirs=tree.include_dirs, lockstep=lockstep,
                                      target=target)
    found = [Variant("fibers", library, "mtw_entry", False, lockstep)]
    if never_blocks(program):
        found.append(Variant("loops", library, "mtw_entry_barrier_free", True, False))
    elif not lockstep:
        fast = engine_build(program, target)
        if fast.path is not None:
            found.append(Variant("fast", fast.path, "mtw_entry_barrier_free", True, False))
    return found


# --- plans and runs ------------------------------------------------------------------------------


def write_plan(program: Program, call: Dispatch, variant: Variant, folder: Path) -> Path:
    """The plan of `call` for the driver: the memory mtwork would give the kernel (fresh
    buffers made and filled as sim makes them), slot by slot, and the geometry."""
    if any(c.isspace() for c in str(folder)):
        raise ValueError(f"the driver reads plans word by word: no spaces in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    memory = Memory(program, call)
    geometry = call.geometry
    clamped = [min(t, g) for t, g in zip(geometry.threadgroup, geometry.grid)]
    lines = [f"entry {variant.entry}", f"barrier_free {int(variant.barrier_free)}",
             f"lockstep {int(variant.lockstep)}", "grid {} {} {}".format(*geometry.grid),
             "threadgroup {} {} {}".format(*clamped), f"tg_static {memory.threadgroup_bytes}",
             f"slots {len(memory.table)}"]
    for index, array in sorted(memory.arrays.items()):
        lo, hi = byte_span(array)
        blob = folder / f"in{index}.bin"
        blob.write_bytes(ctypes.string_at(lo, hi - lo) if hi > lo else b"\0")
        lines.append(f"buffer {index} {max(hi - lo, 1)} {array.ctypes.data - lo} {blob}")
    offset = 0
    for index, size in sorted(call.threadgroup_memory.items()):
        lines.append(f"offset {THREADGROUP_SLOT_BASE + index} {offset}")
        offset += size
    plan = folder / "plan.txt"
    plan.write_text("\n".join(lines) + "\n")
    return plan


@dataclass(frozen=True)
class Run:
    status: int  # runtime.h's mtw_status: 0 ok, 2 fault, 8 needs fibers, ...
    message: str
    buffers: dict[int, bytes]  # by slot: every buffer's bytes after the dispatch


def run(target: Target, folder: Path, runtime: Path, variant: Variant, plan: Path,
        timeout: float = 600) -> Run:
    """The driver for `target` runs `plan` on `variant`'s library (under qemu for arm64 on
    another CPU)."""
    out = plan.parent / f"out-{target.name}-{variant.engine}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    command = [str(driver(target, folder)), str(runtime), str(variant.library), str(plan),
               str(out)]
    if target.cpu != HOST.cpu:
        command = ["qemu-aarch64", "-L", str(ARM64_SYSROOT), *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "QEMU_LD_PREFIX": str(ARM64_SYSROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"the driver for {target.name} failed ({done.returncode}):\n"
                           f"{done.stdout}\n{done.stderr}")
    status, _, message = (out / "status.txt").read_text().partition("\n")
    buffers = {int(p.stem.removeprefix("slot")): p.read_bytes() for p in out.glob("slot*.bin")}
    return Run(int(status), message.strip(), buffers)


def differing(a: Run, b: Run) -> list[str]:
    """The slots whose bytes differ between two runs, with how many bytes each."""
    found = []
    for slot in sorted(set(a.buffers) | set(b.buffers)):
        x, y = a.buffers.get(slot, b""), b.buffers.get(slot, b"")
        if x != y:
            n = min(len(x), len(y))
            diff = int(np.count_nonzero(np.frombuffer(x[:n], np.uint8)
                                        != np.frombuffer(y[:n], np.uint8)))
            found.append(f"slot {slot}: {diff} of {n} bytes")
    return found


__all__ = ["HOST", "LINUX_ARM64", "Recorded", "Recorder", "Run", "Variant", "differing",
           "driver", "qemu_missing", "run", "variants", "write_plan"]
