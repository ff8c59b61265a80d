"""Kernels run in a worker process, so that nothing a kernel does can take the notebook
down: a crash, heap corruption, `exit()`, `abort()` or a hang ends the worker, becomes a
`KernelFault` (or `KernelTimeout`) naming the kernel, and the next call starts a new one.

The worker (`worker.py`) is a new interpreter that imports it (never a fork or a spawn
that re-runs the caller's script) in its own session (so a terminal's Ctrl-C reaches
mtwork, which then ends the worker at once). Buffers are shared memory (`shared.py`):
memory that already is (an earlier kernel's output, the MLX output the call writes) is
used where it is; other inputs are copied into staging blocks and the written ones out
(`placement.py`); messages are small pickles over a Unix socket (`channel.py`), each
segment's file descriptor sent with the first message that uses it. A kernel's
description is sent once and named by a token afterwards; so is a call's plan (its
geometry, options and where each buffer sits), so that a repeated call sends a few
integers and the worker reuses what it built for the plan. Compiling happens here, in
mtwork's process: no kernel code runs in it.

The worker's lifecycle is kept here rather than in an executor library: a call's round
trip over this socket is about 30 µs, over loky's reusable executor about 380 µs, and a
cached call of a tiny kernel should cost well under half a millisecond.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ....cachedir import cache_dir
from ....dispatch import BodyForm, Completion, Dispatch, Engine, Program
from ....errors import KernelCancelled, KernelFault, KernelTimeout
from . import runtime
from .channel import PLANS_KEPT, PROGRAMS_KEPT, ChannelClosed, receive, send
from .logbuffer import HEADER_BYTES, LogBuffer, RawLog
from .placement import Placed, place
from .shared import SharedBlock, SharedHeap, heap

__all__ = ["Isolated", "isolate_by_default"]

# How long past its watchdog a worker may stay silent before it is killed: the watchdog's
# own limit, between 2 and 10 seconds.
_GRACE_BOUNDS = (2.0, 10.0)


def isolate_by_default() -> bool:
    """$MTWORK_ISOLATE: "0" runs kernels in mtwork's own process; anything else, or
    nothing, in the worker."""
    value = os.environ.get("MTWORK_ISOLATE", "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on", ""):
        return True
    raise ValueError(f"MTWORK_ISOLATE must be 1 (isolated, the default) or 0 (in-process), "
                     f"got {os.environ['MTWORK_ISOLATE']!r}")


class _Kept:
    """What the worker has been sent, by id (kernel descriptions, call plans), with what
    mtwork keeps beside each: the most recently used are kept, and the ids let go are
    told to the worker with the next request, so both sides always hold the same ones."""

    def __init__(self, limit: int) -> None:
        self._entries: OrderedDict[Any, tuple[int, Any]] = OrderedDict()
        self._limit = limit

    def get(self, key: Any) -> tuple[int, Any] | None:
        """`key`'s id and value, if kept (without counting as a use)."""
        return self._entries.get(key)

    def use(self, key: Any, kept: tuple[int, Any] | None, value: Any,
            new_id: Callable[[], int], forget: list[int]) -> tuple[int, bool]:
        """`key`'s id, given what `get` found (`kept`), or a new one for `value`; and
        whether it is new (then the worker must be sent it). An id let go goes to
        `forget`."""
        if kept is not None:
            self._entries.move_to_end(key)
            return kept[0], False
        self._entries[key] = (known := new_id()), value
        if len(self._entries) > self._limit:
            forget.append(self._entries.popitem(last=False)[1][0])
        return known, True

    def clear(self) -> None:
        self._entries.clear()


class Isolated:
    """The worker process and the arena it shares; one dispatch at a time. It keeps the
    `programs_kept` kernels and `plans_kept` call plans used last."""

    def __init__(self, *, programs_kept: int = PROGRAMS_KEPT,
                 plans_kept: int = PLANS_KEPT) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._sent: set[int] = set()  # the segments the worker has mapped
        self._programs = _Kept(programs_kept)
        self._plans = _Kept(plans_kept)
        self._ids = itertools.count()
        self._cancelled = False
        self._log: SharedBlock | None = None  # where dispatches' logs go, reused
        self._idle_timer: threading.Timer | None = None
        # Ended before the interpreter tears down: no worker left running, no socket open.
        atexit.register(_close_if_alive, weakref.ref(self))

    # --- the worker ----------------------------------------------------------------------

    def start(self) -> None:
        """Starts the worker, unless one runs: it imports mtwork while the caller goes on
        (a dispatch starts one too)."""
        self._cancel_idle()
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        # One cache per process tree: the worker uses the folder this process settled on
        # (a fallback for an unusable one included), not a choice of its own.
        env["MTWORK_CACHE_DIR"] = str(cache_dir())
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(Path(__file__).parents[4]),
             str(child.fileno())],
            pass_fds=[child.fileno()], env=env, start_new_session=True,
            stdin=subprocess.DEVNULL)
        child.close()
        self._sock = parent
        self._sent.clear()
        self._programs.clear()
        self._plans.clear()

    def _stop(self, grace: float = 0.0) -> int | None:
        """Ends the worker: the channel closes, which it ends on by itself within `grace`
        seconds, or it is killed; returns how it ended (a negative signal number)."""
        proc, sock = self._proc, self._sock
        self._proc, self._sock = None, None
        if sock is not None:
            sock.close()
        if proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
        if proc.poll() is None:
            proc.kill()
        return proc.wait()

    @property
    def pid(self) -> int | None:
        """The worker's process id, while one runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def cancel(self) -> None:
        """Stops the kernel that is running (from any thread): the worker ends."""
        self._cancelled = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def close(self) -> None:
        """Ends the worker (given a second to end by itself). The shared memory stays:
        arrays may still use it (a next worker maps it again)."""
        self._cancel_idle()
        with self._lock:
            self._stop(grace=1.0)
            if self._log is not None:
                self._log.release()
                self._log = None

    def close_when_idle(self, seconds: float) -> None:
        """Ends the worker in `seconds` unless a dispatch comes first (a process whose
        kernels are all gone should not keep one; a test suite that makes a kernel per
        test should not start one per test either)."""
        self._cancel_idle()
        timer = threading.Timer(seconds, self._idle_end)
        timer.daemon = True
        self._idle_timer = timer
        timer.start()

    def _idle_end(self) -> None:
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer = None
                self._stop(grace=1.0)

    def _cancel_idle(self) -> None:
        timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()

    # --- one dispatch --------------------------------------------------------------------

    def dispatch(self, program: Program, call: Dispatch, log_room: int = 0,
                 on_log: Callable[[RawLog | None], None] | None = None) -> Completion:
        """Runs the call in the worker, its messages in a log of `log_room` bytes of
        records (0: none). `on_log` hears them (None: no log) when the dispatch ends,
        whichever way (the log lies in shared memory, which outlives the worker), before
        another dispatch can write there."""
        # The watchdog's limit is read here, where the caller's environment is: a worker
        # keeps the environment it started with.
        timeout = call.options.timeout or runtime.default_timeout()
        self._cancel_idle()
        with self._lock:
            self._cancelled = False
            self._ensure_started()
            shared = heap()  # this process's (a forked child has its own)
            request, placed, fds = self._request(program, call, timeout, shared, log_room)
            try:
                return self._run(program, call, timeout, shared, request, placed, fds)
            finally:
                if on_log is not None:
                    on_log(self._read_log(shared, placed))

    def _run(self, program: Program, call: Dispatch, timeout: float, shared: SharedHeap,
             request: tuple, placed: Placed, fds: list[int]) -> Completion:
        """Sends the request and makes the completion of the reply (lock held)."""
        try:
            send(self._sock, request, fds)  # type: ignore[arg-type]
            self._sent |= placed.segments
            reply = self._wait(program, timeout)
        except KeyboardInterrupt:
            placed.release()
            self._stop()
            raise
        except (ChannelClosed, OSError):
            placed.release()
            status = self._stop()
            # The next call's worker, importing while the caller looks (if it cannot
            # start now, the next call says why).
            with contextlib.suppress(OSError):
                self._start()
            if self._cancelled:
                raise KernelCancelled(program.label, "stopped before it ended") from None
            raise KernelFault(program.label, _death(status)) from None
        except BaseException:
            placed.release()
            raise
        return self._completion(reply, placed, call, shared,
                                as_mx=isinstance(program.form, BodyForm))

    def _request(self, program: Program, call: Dispatch, timeout: float, shared: SharedHeap,
                 room: int) -> tuple[tuple, Placed, list[int]]:
        """The message for the worker, with every buffer placed in shared memory
        (`placement.place`), and the file descriptors of the segments the worker has not
        mapped yet. A call like an earlier one (same geometry, options, buffers and
        placements) reuses its plan."""
        placed = place(shared, call)
        try:
            if room:
                placed.with_log(self._log_block(shared, HEADER_BYTES + room),
                                HEADER_BYTES + room)
                # Emptied before the worker writes: a worker that dies leaves no old log.
                LogBuffer(shared.segment(placed.log.segment).mapping.view(placed.log)).reset()
            new = sorted(placed.segments - self._sent)
            fds = [shared.segment(s).mapping.fd for s in new]
            # The plan does not depend on the kernel: calls of several kernels share it.
            plan = (call.geometry, call.options, timeout,
                    tuple(sorted(call.threadgroup_memory.items())), placed.opened,
                    placed.zeroed, placed.worker_buffers(call), call.unbound, placed.log)
            kept_plan = self._plans.get(plan)
            # Nothing may fail between naming what the worker is sent and sending it.
            forget: list[int] = []
            token, new_program = self._programs.use(program, self._programs.get(program),
                                                    None, self._ids.__next__, forget)
            plan_id, new_plan = self._plans.use(plan, kept_plan, None, self._ids.__next__,
                                                forget)
        except BaseException:
            placed.release()
            raise
        gone = shared.take_forgotten()
        self._sent -= set(gone)
        request = (token, program if new_program else None, plan_id,
                   plan if new_plan else None, tuple(forget), tuple(new), tuple(gone))
        return request, placed, fds

    def _log_block(self, shared: SharedHeap, nbytes: int) -> SharedBlock:
        """The block dispatches' logs go to: kept from call to call (its range stays
        open in the worker), made anew for another size or heap (a forked child's)."""
        block = self._log
        if block is None or block.heap is not shared or block.nbytes != nbytes:
            if block is not None and block.heap is shared:
                block.release()
            block = self._log = shared.allocate(nbytes)
        return block

    @staticmethod
    def _read_log(shared: SharedHeap, placed: Placed) -> RawLog | None:
        """The messages of the dispatch `placed` was for, from shared memory."""
        if placed.log is None:
            return None
        return LogBuffer(shared.segment(placed.log.segment).mapping.view(placed.log)).read()

    def _wait(self, program: Program, limit: float) -> Any:
        grace = min(max(limit, _GRACE_BOUNDS[0]), _GRACE_BOUNDS[1])
        ready, _, _ = select.select([self._sock], [], [], limit + grace)
        if not ready:
            self._stop()
            raise KernelTimeout(program.label, f"no answer {limit + grace:g} s after it "
                                               f"started (the watchdog's {limit:g} s and "
                                               f"{grace:g} s of grace): the worker was ended")
        reply, _ = receive(self._sock)  # type: ignore[arg-type]
        return reply

    def _completion(self, reply: Any, placed: Placed, call: Dispatch, shared: SharedHeap,
                    as_mx: bool) -> Completion:
        """The written buffers, copied out of staging blocks where they were staged
        (`Placed.finish`)."""
        kind, value = reply
        if kind == "error":
            placed.release()
            raise value
        written, report, used, engine, why, counters = value
        buffers = placed.finish(shared, written, call, as_mx)
        return Completion(buffers, report, used, Engine(engine, why), counters)


# The worker's entry: this mtwork (its folder is the first argument) before the working
# directory, which `python -m` would put first, so the worker runs the caller's code.
_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
              "from mtwork.backends.sim.worker import main; main(int(sys.argv[1]))")


def _close_if_alive(ref: weakref.ref[Isolated]) -> None:
    isolated = ref()
    if isolated is not None:
        isolated.close()


def _death(status: int | None) -> str:
    if status is not None and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        how = f"was killed by {name}"
    else:
        how = f"exited with status {status}"
    return (f"the worker process running it {how} (the kernel corrupted memory, called "
            f"exit() or abort(), or the emulator failed); mtwork starts a new worker for "
            f"the next call")
