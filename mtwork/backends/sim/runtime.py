"""ctypes binding to the emulator runtime: load kernel libraries and dispatch them."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ...errors import (
    EmulatorUnavailable,
    KernelDeadlock,
    KernelFault,
    KernelTimeout,
    ThreadgroupMemoryError,
)
from ...limits import THREADGROUP_MEMORY_BYTES
from .compiler import runtime_library

ABI_VERSION = 2
DEFAULT_TIMEOUT_S = 120.0

# Status codes of runtime/runtime.h.
(_OK, _RUNNING, _FAULT, _DEADLOCK, _TG_MEMORY, _CANCELLED, _KERNEL_ERROR, _SYSTEM,
 _NEEDS_FIBERS) = range(9)


class NeedsFibers(Exception):
    """A kernel dispatched as barrier-free blocked; run it again with barrier_free=False."""


class SanitizerStop(KernelFault):
    """The sanitizer stopped the kernel before an access that would corrupt memory."""


class BufferInfo(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("element_size", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("written", ctypes.c_void_p),
    ]


BUFFER_INPUT, BUFFER_OUTPUT, BUFFER_INTERNAL = 0, 1, 2


class Finding(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("write", ctypes.c_uint32),
        ("buffer", ctypes.c_int32),
        ("tg_array", ctypes.c_int32),
        ("element", ctypes.c_int64),
        ("thread", ctypes.c_uint32 * 3),
        ("other", ctypes.c_uint32 * 3),
        ("group", ctypes.c_uint32 * 3),
        ("other_write", ctypes.c_uint32),
        ("pc", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
    ]


@dataclass
class Sanitizing:
    """What a sanitized dispatch needs: the buffers and room for findings; after the
    dispatch, the findings and the threadgroup arrays' names and element sizes."""

    buffers: ctypes.Array
    findings: ctypes.Array
    found: list[Finding] = field(default_factory=list)
    arrays: list[tuple[str, int]] = field(default_factory=list)
    shadows: list = field(default_factory=list)  # per buffer: written bytes (numpy uint8)
    names: list[str] = field(default_factory=list)  # per buffer info: the parameter's name
    indices: list[int] = field(default_factory=list)  # per buffer info: its buffer index


class _Launch(ctypes.Structure):
    _fields_ = [
        ("entry", ctypes.c_void_p),
        ("buffers", ctypes.c_void_p),
        ("kernel_name", ctypes.c_char_p),
        ("grid", ctypes.c_uint32 * 3),
        ("threadgroup", ctypes.c_uint32 * 3),
        ("tg_memory_limit", ctypes.c_uint32),
        ("tg_static_bytes", ctypes.c_uint32),
        ("workers", ctypes.c_uint32),
        ("barrier_free", ctypes.c_uint32),
        ("sanitize", ctypes.c_uint32),
        ("buffer_info", ctypes.c_void_p),
        ("nbuffers", ctypes.c_uint32),
        ("max_findings", ctypes.c_uint32),
        ("findings", ctypes.c_void_p),
    ]


@cache
def _runtime() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)
    lib.mtw_dispatch_start.argtypes = [ctypes.POINTER(_Launch)]
    lib.mtw_dispatch_start.restype = ctypes.c_int
    lib.mtw_dispatch_wait.argtypes = [ctypes.c_uint32]
    lib.mtw_dispatch_wait.restype = ctypes.c_int
    lib.mtw_dispatch_cancel.argtypes = []
    lib.mtw_dispatch_message.restype = ctypes.c_char_p
    lib.mtw_dispatch_tg_memory.restype = ctypes.c_uint32
    lib.mtw_sanitizer_findings.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_arrays.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_array_name.restype = ctypes.c_char_p
    lib.mtw_sanitizer_tg_array_name.argtypes = [ctypes.c_uint32]
    lib.mtw_sanitizer_tg_array_element_size.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_array_element_size.argtypes = [ctypes.c_uint32]
    if lib.mtw_abi_version() != ABI_VERSION:
        raise EmulatorUnavailable("the emulator runtime library does not match this mtwork")
    return lib


@dataclass(frozen=True)
class KernelLibrary:
    """A compiled kernel: its shared library and entry point."""

    path: Path
    handle: ctypes.CDLL
    entry: int
    entry_barrier_free: int


_libraries: dict[Path, KernelLibrary] = {}
_libraries_lock = threading.Lock()
# One dispatch at a time: the runtime's worker pool is shared.
_dispatch_lock = threading.Lock()


def load(path: Path) -> KernelLibrary:
    with _libraries_lock:
        lib = _libraries.get(path)
        if lib is None:
            _runtime()
            handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
            lib = KernelLibrary(
                path,
                handle,
                ctypes.cast(handle.mtw_entry, ctypes.c_void_p).value,
                ctypes.cast(handle.mtw_entry_barrier_free, ctypes.c_void_p).value,
            )
            _libraries[path] = lib
    return lib


def default_timeout() -> float:
    value = os.environ.get("MTWORK_TIMEOUT")
    return float(value) if value else DEFAULT_TIMEOUT_S


def dispatch(
    library: KernelLibrary,
    kernel_name: str,
    buffers: ctypes.Array,
    grid: tuple[int, int, int],
    threadgroup: tuple[int, int, int],
    *,
    tg_static_bytes: int = 0,
    tg_memory_limit: int = THREADGROUP_MEMORY_BYTES,
    timeout: float | None = None,
    workers: int = 0,
    barrier_free: bool = False,
    sanitizing: Sanitizing | None = None,
) -> int:
    """Runs the kernel over the grid; returns the threadgroup memory it used (bytes).

    `barrier_free` runs the group as plain loops: only for kernels that never block.
    Waits in short slices so Ctrl-C and the watchdog (`timeout` seconds, default
    $MTWORK_TIMEOUT or 120) can stop a kernel that never ends.
    """
    rt = _runtime()
    barrier_free = barrier_free and sanitizing is None  # sanitizing needs thread identities
    launch = _Launch(
        entry=library.entry_barrier_free if barrier_free else library.entry,
        buffers=ctypes.cast(buffers, ctypes.c_void_p).value,
        kernel_name=kernel_name.encode(),
        grid=(ctypes.c_uint32 * 3)(*grid),
        threadgroup=(ctypes.c_uint32 * 3)(*threadgroup),
        tg_memory_limit=tg_memory_limit,
        tg_static_bytes=tg_static_bytes,
        workers=workers,
        barrier_free=int(barrier_free),
    )
    if sanitizing is not None:
        launch.sanitize = 1
        launch.buffer_info = ctypes.cast(sanitizing.buffers, ctypes.c_void_p).value
        launch.nbuffers = len(sanitizing.buffers)
        launch.findings = ctypes.cast(sanitizing.findings, ctypes.c_void_p).value
        launch.max_findings = len(sanitizing.findings)
    limit = default_timeout() if timeout is None else timeout
    with _dispatch_lock:
        if rt.mtw_dispatch_start(ctypes.byref(launch)) != 0:
            raise EmulatorUnavailable("the emulator runtime could not start its worker threads")
        start = time.monotonic()
        timed_out = False
        try:
            status = rt.mtw_dispatch_wait(20)
            while status == _RUNNING:
                if not timed_out and time.monotonic() - start > limit:
                    timed_out = True
                    rt.mtw_dispatch_cancel()
                status = rt.mtw_dispatch_wait(50)
        except BaseException:
            # Ctrl-C in a notebook: stop the kernel, then let the interrupt through.
            rt.mtw_dispatch_cancel()
            while rt.mtw_dispatch_wait(100) == _RUNNING:
                pass
            raise
        message = rt.mtw_dispatch_message().decode(errors="replace")
        used = rt.mtw_dispatch_tg_memory()
        if sanitizing is not None:
            sanitizing.found = list(sanitizing.findings[: rt.mtw_sanitizer_findings()])
            sanitizing.arrays = [
                (rt.mtw_sanitizer_tg_array_name(i).decode(errors="replace"),
                 rt.mtw_sanitizer_tg_array_element_size(i))
                for i in range(rt.mtw_sanitizer_tg_arrays())
            ]
    if status == _OK:
        return used
    if status == _NEEDS_FIBERS:
        raise NeedsFibers(message)
    if timed_out or status == _CANCELLED:
        raise KernelTimeout(
            kernel_name,
            f"still running after {limit:g} s (the watchdog limit; raise it with "
            f"timeout= or $MTWORK_TIMEOUT if the kernel is just slow)",
        )
    if status == _DEADLOCK:
        raise KernelDeadlock(kernel_name, message)
    if status == _TG_MEMORY:
        raise ThreadgroupMemoryError(kernel_name, message)
    if status == _FAULT and sanitizing is not None and message.startswith("stopped by the"):
        raise SanitizerStop(kernel_name, message)
    if status in (_FAULT, _KERNEL_ERROR):
        raise KernelFault(kernel_name, message)
    raise EmulatorUnavailable(f"emulator runtime failure in `{kernel_name}`: {message}")
