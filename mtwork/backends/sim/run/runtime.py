"""ctypes binding to the emulator runtime: load kernel libraries and dispatch them."""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ....dispatch import check_timeout, env_timeout
from ....errors import (
    EmulatorUnavailable,
    KernelCancelled,
    KernelDeadlock,
    KernelFault,
    KernelTimeout,
    ThreadgroupMemoryError,
)
from ....limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES
from .abi import (
    LaunchRecord,
    LiveThreadRecord,
    Sanitizing,
    runtime_handle,
    runtime_loaded,
)

DEFAULT_TIMEOUT_S = 120.0
# Metal takes a grid as three 32-bit counts (MTLDispatchThreadsIndirectArguments'
# threadsPerGrid is (UInt32, UInt32, UInt32); thread_position_in_grid is a uint3).
MAX_GRID_DIMENSION = 2**32 - 1
# Metal documents no limit on the product; the emulator counts threads and threadgroups
# in 64 bits.
MAX_GRID_THREADS = 2**64 - 1
LIVE_THREADS_LISTED = 4

# Status codes of runtime/runtime.h.
(_OK, _RUNNING, _FAULT, _DEADLOCK, _TG_MEMORY, _CANCELLED, _KERNEL_ERROR, _SYSTEM,
 _NEEDS_FIBERS, _SANITIZER_STOP, _LOGGED) = range(11)


class NeedsFibers(Exception):
    """A kernel dispatched as barrier-free blocked; run it again with barrier_free=False."""


class Logged(NeedsFibers):
    """A kernel dispatched as barrier-free (plain loops, the fast engine) logged: run it
    again on fibers, where each message knows the thread that wrote it."""


class SanitizerStop(KernelFault):
    """The sanitizer stopped the kernel before an access that would corrupt memory."""


_LIVE_STATES = ("running", "waiting at threadgroup_barrier", "waiting in a SIMD-group function",
                "ready to run")
_UNKNOWN_THREAD = (0xFFFFFFFF,) * 3


@dataclass(frozen=True)
class LiveThread:
    """A thread that had not finished when the watchdog stopped its dispatch: where it
    was (`pc`, an address in the process; see `code_offset`) and what it was doing."""

    group: tuple[int, int, int]
    thread: tuple[int, int, int] | None  # None when the barrier-free path ran it
    state: str
    pc: int

    def describe(self, library: KernelLibrary | None = None) -> str:
        who = (f"thread {self.thread} of threadgroup {self.group}" if self.thread is not None
               else f"a thread of threadgroup {self.group}")
        offset = code_offset(library, self.pc) if library is not None else None
        where = f"{library.path.name}+{offset:#x}" if offset is not None else f"pc {self.pc:#x}"
        return f"{who} {self.state} ({where})"


# Defined in a kernel library that has a logging call (include/mtw_logging.h).
_LOGS_MARKER = "_ZN5metal15__os_log_format4logsIvE6markerE"


@dataclass(frozen=True)
class KernelLibrary:
    """A compiled kernel: its shared library and entry point, and whether it has a
    logging call (`logs`: only then does a dispatch of it get a log)."""

    path: Path
    handle: ctypes.CDLL
    entry: int
    entry_barrier_free: int
    logs: bool = False


_libraries: dict[Path, KernelLibrary] = {}
_libraries_lock = threading.Lock()
# One dispatch at a time: the runtime's worker pool is shared.
_dispatch_lock = threading.Lock()
# A cancel from another thread: set while a dispatch runs, told apart from the watchdog.
_cancel_lock = threading.Lock()
_running = threading.Event()
_cancelled = threading.Event()


def load(path: Path) -> KernelLibrary:
    with _libraries_lock:
        lib = _libraries.get(path)
        if lib is None:
            runtime_handle()
            handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
            lib = KernelLibrary(
                path,
                handle,
                ctypes.cast(handle.mtw_entry, ctypes.c_void_p).value,
                ctypes.cast(handle.mtw_entry_barrier_free, ctypes.c_void_p).value,
                hasattr(handle, _LOGS_MARKER),
            )
            _libraries[path] = lib
    return lib


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@cache
def _dladdr() -> Callable[..., int]:
    fn = ctypes.CDLL(None).dladdr
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    fn.restype = ctypes.c_int
    return fn


def _image_base(address: int) -> int | None:
    info = _DlInfo()
    if not address or not _dladdr()(address, ctypes.byref(info)) or not info.dli_fbase:
        return None
    return info.dli_fbase


def code_offset(library: KernelLibrary, pc: int) -> int | None:
    """`pc` as an offset in `library`'s shared library (what a symbolizer such as
    llvm-symbolizer takes with the library's path), or None if `pc` lies elsewhere (in
    the runtime, say)."""
    base = _image_base(pc)
    return pc - base if base is not None and base == _image_base(library.entry) else None


def default_timeout() -> float:
    """The watchdog limit: $MTWORK_TIMEOUT seconds, else 120."""
    return env_timeout() or DEFAULT_TIMEOUT_S


def _checked_geometry(grid: tuple[int, int, int],
                      threadgroup: tuple[int, int, int]) -> int:
    """Refuses what would not fit the runtime's 32-bit counts; returns the thread count."""
    for what, dims in (("grid", grid), ("threadgroup", threadgroup)):
        if len(dims) != 3 or any(isinstance(d, bool) or not isinstance(d, int) for d in dims):
            raise TypeError(f"{what} must be three integers, got {dims!r}")
    for axis, n in zip("xyz", grid):
        if not 0 <= n <= MAX_GRID_DIMENSION:
            raise ValueError(f"grid.{axis} = {n} is outside what Metal allows: 0 to "
                             f"{MAX_GRID_DIMENSION} (2**32 - 1) threads per dimension")
    total = math.prod(grid)
    if total > MAX_GRID_THREADS:
        raise ValueError(f"grid {tuple(grid)} has {total} threads, more than the "
                         f"{MAX_GRID_THREADS} (2**64 - 1) the emulator can count")
    if total == 0:
        return 0
    for axis, n in zip("xyz", threadgroup):
        if not 1 <= n <= MAX_THREADS_PER_THREADGROUP:
            raise ValueError(f"threadgroup.{axis} = {n} is outside 1 to "
                             f"{MAX_THREADS_PER_THREADGROUP}")
    if math.prod(threadgroup) > MAX_THREADS_PER_THREADGROUP:
        raise ValueError(f"threadgroup {tuple(threadgroup)} has {math.prod(threadgroup)} "
                         f"threads, more than the {MAX_THREADS_PER_THREADGROUP} Metal allows")
    return total


def last_live_threads() -> tuple[int, list[LiveThread]]:
    """Threads that had not finished when the watchdog stopped the last dispatch: how many
    there were, and the first ones recorded."""
    rt = runtime_handle()
    out = (LiveThreadRecord * 64)()
    total = rt.mtw_dispatch_live_threads(out, len(out))
    live = []
    for t in out[: min(total, len(out))]:
        thread = tuple(t.thread)
        live.append(LiveThread(
            group=tuple(t.group),
            thread=None if thread == _UNKNOWN_THREAD else thread,
            state=_LIVE_STATES[t.state] if t.state < len(_LIVE_STATES) else "live",
            pc=int(t.pc),
        ))
    return int(total), live


def _timeout_detail(limit: float, library: KernelLibrary,
                    live_threads: tuple[int, list[LiveThread]]) -> str:
    detail = (f"still running after {limit:g} s (the watchdog limit; raise it with "
              f"timeout= or $MTWORK_TIMEOUT if the kernel is just slow)")
    total, live = live_threads
    if not live:
        return detail
    live = sorted(live, key=lambda t: t.state != "running")  # the ones that loop first
    listed = "; ".join(t.describe(library) for t in live[:LIVE_THREADS_LISTED])
    more = f"; and {total - LIVE_THREADS_LISTED} more" if total > LIVE_THREADS_LISTED else ""
    return (f"{detail}; {total} started thread{'s' if total != 1 else ''} had not finished: "
            f"{listed}{more} (offsets in {library.path})")


_LAUNCHES_KEPT = 256
_launches: dict[tuple, LaunchRecord] = {}


def _launch_template(library: KernelLibrary, kernel_name: str, grid: tuple[int, ...],
                     threadgroup: tuple[int, ...], tg_static_bytes: int, tg_memory_limit: int,
                     workers: int, barrier_free: bool, lockstep: bool) -> LaunchRecord:
    """A dispatch's launch record but for its buffers and sanitizer: made once per kernel
    and geometry (a cached call copies it instead of building it field by field)."""
    key = (library.path, kernel_name, grid, threadgroup, tg_static_bytes, tg_memory_limit,
           workers, barrier_free, lockstep)
    template = _launches.get(key)
    if template is None:
        template = LaunchRecord(
            entry=library.entry_barrier_free if barrier_free else library.entry,
            kernel_name=kernel_name.encode(),
            grid=(ctypes.c_uint32 * 3)(*grid),
            threadgroup=(ctypes.c_uint32 * 3)(*threadgroup),
            tg_memory_limit=tg_memory_limit,
            tg_static_bytes=tg_static_bytes,
            workers=workers,
            barrier_free=int(barrier_free),
            lockstep=int(lockstep),
        )
        if len(_launches) >= _LAUNCHES_KEPT:
            _launches.clear()
        _launches[key] = template
    return template


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
    lockstep: bool = False,
    groups: Sequence[int] | None = None,
    log: int | None = None,
) -> int:
    """Runs the kernel over the grid; returns the threadgroup memory it used (bytes).

    `groups` runs only those threadgroups (linear indices, x fastest), not the whole grid.

    `barrier_free` runs the group as plain loops: only for kernels that never block.
    `lockstep`: the library traces its loads and stores (compiler.LOCKSTEP_FLAGS), and
    each SIMD-group steps through threadgroup memory in lockstep. `log`: the address of
    the log's header (`logbuffer.LogBuffer`), where the kernel's messages go; None: its
    logging calls do nothing.
    Waits in short slices so Ctrl-C and the watchdog (`timeout` seconds, default
    $MTWORK_TIMEOUT or 120) can stop a kernel that never ends.
    """
    limit = default_timeout() if timeout is None else check_timeout(timeout)
    if _checked_geometry(grid, threadgroup) == 0:
        return tg_static_bytes  # no threads: nothing runs
    rt = runtime_handle()
    barrier_free = barrier_free and sanitizing is None  # sanitizing needs thread identities
    template = _launch_template(library, kernel_name, tuple(grid), tuple(threadgroup),
                                tg_static_bytes, tg_memory_limit, workers, barrier_free,
                                lockstep)
    launch = LaunchRecord.from_buffer_copy(template)  # `template` keeps the name alive
    launch.buffers = ctypes.cast(buffers, ctypes.c_void_p).value
    chosen = None
    if groups is not None:
        chosen = (ctypes.c_uint64 * max(1, len(groups)))(*groups)  # alive until the end
        launch.groups, launch.ngroups = ctypes.addressof(chosen), len(groups)
    launch.log = log
    if sanitizing is not None:
        launch.sanitize = 1
        launch.buffer_info = ctypes.cast(sanitizing.buffers, ctypes.c_void_p).value
        launch.nbuffers = len(sanitizing.buffers)
        launch.findings = ctypes.cast(sanitizing.findings, ctypes.c_void_p).value
        launch.max_findings = len(sanitizing.findings)
    with _dispatch_lock:
        if rt.mtw_dispatch_start(ctypes.byref(launch)) != 0:
            raise EmulatorUnavailable("the emulator runtime could not start its worker threads")
        with _cancel_lock:
            _cancelled.clear()
            _running.set()
        try:
            status, timed_out = _wait(rt, limit)
        finally:
            with _cancel_lock:
                _running.clear()
        message = rt.mtw_dispatch_message().decode(errors="replace")
        used = rt.mtw_dispatch_tg_memory()
        stopped = timed_out or status == _CANCELLED
        live = last_live_threads() if stopped else (0, [])
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
    if status == _LOGGED:
        raise Logged(message)
    if stopped and not timed_out and _cancelled.is_set():
        raise KernelCancelled(kernel_name, "stopped before it ended")
    if stopped:
        raise KernelTimeout(kernel_name, _timeout_detail(limit, library, live))
    raise _failure(status, kernel_name, message)


def cancel() -> None:
    """Stops the dispatch running in this process, if any (from any thread): it raises
    `KernelCancelled`."""
    if not runtime_loaded():
        return  # the runtime was never loaded: nothing runs
    with _cancel_lock:
        if _running.is_set():
            _cancelled.set()
            runtime_handle().mtw_dispatch_cancel()


def _wait(rt: ctypes.CDLL, limit: float) -> tuple[int, bool]:
    """Waits for the running dispatch in short slices, so that Ctrl-C and the watchdog
    (`limit` seconds) can stop it; returns its status and whether the watchdog fired."""
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
    return status, timed_out


_FAILURES: dict[int, type[KernelFault]] = {
    _DEADLOCK: KernelDeadlock, _TG_MEMORY: ThreadgroupMemoryError,
    _SANITIZER_STOP: SanitizerStop, _FAULT: KernelFault, _KERNEL_ERROR: KernelFault,
}


def _failure(status: int, kernel_name: str, message: str) -> Exception:
    error = _FAILURES.get(status)
    if error is None:
        return EmulatorUnavailable(f"emulator runtime failure in `{kernel_name}`: {message}")
    return error(kernel_name, message)
