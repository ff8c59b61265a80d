"""Kernels run in a worker process, so that nothing a kernel does can take the notebook
down: a crash, heap corruption, `exit()`, `abort()` or a hang ends the worker, becomes a
`KernelFault` (or `KernelTimeout`) naming the kernel, and the next call starts a new one.

The worker (`worker.py`) is a new interpreter that imports it (never a fork or a spawn
that re-runs the caller's script) in its own session (so a terminal's Ctrl-C reaches
mtwork, which then ends the worker at once). Buffers travel through a shared `Arena`:
mtwork copies the inputs in and the written buffers out; messages are small pickles over
a Unix socket (`channel.py`). A kernel's description is sent once and named by a token
afterwards; so is a call's plan (its geometry, options and where each buffer sits in the
arena), so that a repeated call sends a few integers and the worker reuses what it built
for the plan. Compiling happens here, in mtwork's process: no kernel code runs in it.

The worker's lifecycle is kept here rather than in an executor library: a call's round
trip over this socket is about 30 µs, over loky's reusable executor about 380 µs, and a
cached call of a tiny kernel should cost well under half a millisecond.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import math
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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ....buffers import byte_span, numpy_view, to_mx
from ....cachedir import cache_dir
from ....dispatch import BodyForm, Bound, Completion, Dispatch, Engine, Fresh, Program
from ....dtypes import storage_numpy_dtype
from ....errors import KernelCancelled, KernelFault, KernelTimeout
from . import runtime
from .arena import PAGE, Arena, Placement, layout
from .channel import PLANS_KEPT, PROGRAMS_KEPT, ChannelClosed, receive, send
from .logbuffer import HEADER_BYTES, LogBuffer, RawLog, buffer_size

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


# How the kernel sees a buffer's bytes: (nbytes spanned, offset of element 0 in them,
# shape, byte strides, numpy dtype).
Span = tuple[int, int, tuple[int, ...], tuple[int, ...], str]


def _source(buf: Bound) -> tuple[np.ndarray, int, Span]:
    """The view whose bytes to copy for a bound buffer (kept alive while they are copied),
    the address they start at, and how the kernel sees them."""
    view = numpy_view(buf.array)
    if buf.contiguous or view.ndim == 0:
        view = np.ascontiguousarray(view)
    if view.flags.c_contiguous:  # its bytes start at element 0
        return view, view.ctypes.data, (view.nbytes, 0, view.shape, view.strides,
                                        view.dtype.str)
    lo, hi = byte_span(view)
    return view, lo, (hi - lo, view.ctypes.data - lo, view.shape, view.strides,
                      view.dtype.str)


def _owners(indices: list[int], spans: dict[int, Span],
            addresses: dict[int, int]) -> tuple[int, ...]:
    """For each buffer, the buffer whose arena memory it uses: itself, or the first bound
    buffer over the very same memory (one buffer bound at several indices is one buffer
    in the arena too, as one MTLBuffer is)."""
    first: dict[tuple[int, int], int] = {}
    owners = []
    for index in indices:
        nbytes = spans[index][0]
        if index in addresses and nbytes:  # the source spans the caller's very bytes
            owners.append(first.setdefault((addresses[index], nbytes), index))
        else:
            owners.append(index)
    return tuple(owners)


@lru_cache(maxsize=1024)
def _fresh_span(shape: tuple[int, ...], dtype: mx.Dtype) -> Span:
    dt = np.dtype(storage_numpy_dtype(dtype))
    return math.prod(shape) * dt.itemsize, 0, shape, _c_strides(shape, dt.itemsize), dt.str


@dataclass(frozen=True)
class _Plan:
    """Where a call's buffers sit in the arena (by buffer index), how big the arena must
    be, the plan as the worker is sent it, and where the dispatch's log is (its offset,
    and its room for records: 0 for none)."""

    placements: dict[int, Placement]
    size: int
    message: tuple
    log: tuple[int, int] = (0, 0)


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
        self._arena = Arena()
        self._arena_sent = False
        self._programs = _Kept(programs_kept)
        self._plans = _Kept(plans_kept)
        self._ids = itertools.count()
        self._cancelled = False
        self._log: tuple[int, int] = (0, 0)  # the last dispatch's log: offset, room
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
        self._arena_sent = False
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
        """Ends the worker (given a second to end by itself) and frees the arena."""
        self._cancel_idle()
        with self._lock:
            self._stop(grace=1.0)
            self._arena.close()

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

    def dispatch(self, program: Program, call: Dispatch) -> Completion:
        # The watchdog's limit is read here, where the caller's environment is: a worker
        # keeps the environment it started with.
        timeout = call.options.timeout or runtime.default_timeout()
        self._cancel_idle()
        with self._lock:
            self._cancelled = False
            self._ensure_started()
            request, placements = self._request(program, call, timeout)
            fds = [] if self._arena_sent else [self._arena.fd]
            try:
                send(self._sock, request, fds)  # type: ignore[arg-type]
                self._arena_sent = True
                reply = self._wait(program, timeout)
            except KeyboardInterrupt:
                self._stop()
                raise
            except (ChannelClosed, OSError):
                status = self._stop()
                # The next call's worker, importing while the caller looks (if it cannot
                # start now, the next call says why).
                with contextlib.suppress(OSError):
                    self._start()
                if self._cancelled:
                    raise KernelCancelled(program.label, "stopped before it ended") from None
                raise KernelFault(program.label, _death(status)) from None
            return self._completion(reply, placements, call,
                                    as_mx=isinstance(program.form, BodyForm))

    def _request(self, program: Program, call: Dispatch, timeout: float
                 ) -> tuple[tuple, dict[int, Placement]]:
        """The message for the worker, with every buffer placed in the arena (copied in
        for bound ones), and where each buffer is, to copy the written ones back. A call
        like an earlier one (same geometry, options, buffer shapes and aliasing) reuses
        its plan."""
        indices = sorted(call.buffers)
        sources: dict[int, tuple[np.ndarray, int]] = {}
        spans: dict[int, Span] = {}
        shapes = []
        for index in indices:
            buf = call.buffers[index]
            if isinstance(buf, Fresh):
                spans[index] = _fresh_span(tuple(buf.shape), buf.dtype)
                shapes.append(buf)
            else:
                view, address, spans[index] = _source(buf)
                sources[index] = view, address
                shapes.append((spans[index], buf.dtype, buf.writable))
        owners = _owners(indices, spans, {i: a for i, (_, a) in sources.items()})
        log_room = 0 if call.options.log is False else buffer_size()
        # The plan does not depend on the kernel: calls of several kernels share it.
        key = (call.geometry, call.options, timeout,
               tuple(sorted(call.threadgroup_memory.items())), tuple(indices), tuple(shapes),
               owners, log_room)
        kept_plan = self._plans.get(key)
        plan = (kept_plan[1] if kept_plan is not None
                else _plan(call, indices, spans, owners, timeout, log_room))
        if self._arena.grow(plan.size):
            self._arena_sent = False
        self._log = plan.log
        if log_room:  # empty before the worker writes: a worker that dies leaves no old log
            LogBuffer.over(self._arena.map, *plan.log).reset()
        for index, owner in zip(indices, owners):
            if index in sources and owner == index:
                p = plan.placements[index]
                ctypes.memmove(self._arena.address(p.start), sources[index][1], p.nbytes)
        # Nothing may fail between naming what the worker is sent and sending it.
        forget: list[int] = []
        token, new_program = self._programs.use(program, self._programs.get(program), None,
                                                self._ids.__next__, forget)
        plan_id, new_plan = self._plans.use(key, kept_plan, plan, self._ids.__next__, forget)
        request = (token, program if new_program else None, plan_id,
                   plan.message if new_plan else None, tuple(forget))
        return request, plan.placements

    def last_log(self) -> RawLog | None:
        """The messages of the last dispatch, read from the arena (also when its worker
        died); None when it kept no log."""
        offset, room = self._log
        if not room or self._arena.map is None:
            return None
        return LogBuffer.over(self._arena.map, offset, room).read()

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

    def _completion(self, reply: Any, placements: dict[int, Placement], call: Dispatch,
                    as_mx: bool) -> Completion:
        """The written buffers copied out of the arena: into the caller's writable numpy
        arrays, or the memory `call.into` gives, else into new arrays (``mx.array`` ones
        when `as_mx`: a body-form kernel returns those, and one copy is cheaper than
        two)."""
        kind, value = reply
        if kind == "error":
            raise value
        written, report, used, engine, why, counters = value
        buffers = {}
        for index in written:
            arena_view = placements[index].view(self._arena.map)  # type: ignore[arg-type]
            buf = call.buffers[index]
            if isinstance(buf, Bound) and isinstance(buf.array, np.ndarray) and buf.writable:
                np.copyto(buf.array, arena_view)
                buffers[index] = buf.array
            elif index in call.into:  # an output of MLX's graph: one copy, into it
                np.copyto(call.into[index], arena_view)
                buffers[index] = call.into[index]
            elif as_mx and isinstance(buf, Fresh):
                buffers[index] = to_mx(arena_view, buf.dtype)
            else:
                buffers[index] = np.array(arena_view)
            del arena_view
        return Completion(buffers, report, used, Engine(engine, why), counters)


# The worker's entry: this mtwork (its folder is the first argument) before the working
# directory, which `python -m` would put first, so the worker runs the caller's code.
_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
              "from mtwork.backends.sim.worker import main; main(int(sys.argv[1]))")


def _close_if_alive(ref: weakref.ref[Isolated]) -> None:
    isolated = ref()
    if isolated is not None:
        isolated.close()


def _plan(call: Dispatch, indices: list[int], spans: dict[int, Span], owners: tuple[int, ...],
          timeout: float, log_room: int) -> _Plan:
    """Where each buffer of `call` goes in the arena (its log, of `log_room` bytes of
    records, after them), and the plan the worker is sent."""
    placed = sorted(set(owners))
    starts, guards, log_at = layout(tuple(spans[i][0] for i in placed))
    size = log_at + -(-(HEADER_BYTES + log_room) // PAGE) * PAGE if log_room else log_at
    start_of = dict(zip(placed, starts))
    placements = {i: Placement(start_of[owner], *spans[i]) for i, owner in zip(indices, owners)}
    # Sanitized, every access is checked before it happens (an out-of-bounds read is
    # reported, then goes on): guard pages would turn those reads into faults.
    message = (call.geometry, call.options, timeout,
               tuple(sorted(call.threadgroup_memory.items())),
               () if call.options.sanitize else guards,
               tuple((i, placements[i], _spec(call.buffers[i])) for i in indices),
               (log_at, log_room))
    return _Plan(placements, size, message, (log_at, log_room))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _spec(buf: Bound | Fresh) -> tuple:
    """What the worker needs to rebuild a buffer besides its bytes."""
    if isinstance(buf, Fresh):
        return ("fresh", buf)
    return ("bound", buf.dtype, buf.writable)


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
