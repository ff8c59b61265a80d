"""Kernels run in a worker process, so that nothing a kernel does can take the notebook
down: a crash, heap corruption, `exit()`, `abort()` or a hang ends the worker, becomes a
`KernelFault` (or `KernelTimeout`) naming the kernel, and the next call starts a new one.

The worker (`worker.py`) is started with ``python -m`` (so a script without a
``__main__`` guard is never run twice) in its own session (so a terminal's Ctrl-C reaches
mtwork, which then ends the worker at once). Buffers travel through a shared `Arena`:
mtwork copies the inputs in and the written buffers out; messages are small pickles over
a Unix socket (`channel.py`). A kernel's description is sent once and named by a token
afterwards. Compiling happens here, in mtwork's process: no kernel code runs in it.

The worker's lifecycle is kept here rather than in an executor library: a call's round
trip over this socket is about 30 µs, over loky's reusable executor about 380 µs, and a
cached call of a tiny kernel should cost well under half a millisecond.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ...buffers import byte_span, numpy_view
from ...dispatch import Bound, Completion, Dispatch, Fresh, Program
from ...dtypes import storage_numpy_dtype
from ...errors import KernelCancelled, KernelFault, KernelTimeout
from . import runtime
from .arena import Arena, Placement, layout
from .channel import ChannelClosed, receive, send

__all__ = ["Isolated", "isolate_by_default"]

# How long past its watchdog a worker may stay silent before it is killed: the watchdog's
# own limit, between 2 and 10 seconds.
_GRACE_BOUNDS = (2.0, 10.0)
_PROGRAMS_KEPT = 256


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


def _source_bytes(buf: Bound) -> tuple[np.ndarray, Placement]:
    """The bytes to copy for a bound buffer, and how the kernel sees them."""
    view = numpy_view(buf.array)
    if buf.contiguous or view.ndim == 0:
        view = np.ascontiguousarray(view)
    lo, hi = byte_span(view)
    return _span_bytes(view, lo, hi), Placement(0, hi - lo, view.ctypes.data - lo, view.shape,
                                                view.strides, view.dtype.str)


def _owners(indices: list[int], placements: dict[int, Placement],
            sources: dict[int, np.ndarray]) -> dict[int, int]:
    """For each buffer, the buffer whose arena memory it uses: itself, or the first bound
    buffer over the very same memory (one buffer bound at several indices is one buffer
    in the arena too, as one MTLBuffer is)."""
    first: dict[tuple[int, int], int] = {}
    owners = {}
    for index in indices:
        nbytes = placements[index].nbytes
        if index in sources and nbytes:  # the source spans the caller's very bytes
            owners[index] = first.setdefault((sources[index].ctypes.data, nbytes), index)
        else:
            owners[index] = index
    return owners


def _span_bytes(view: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The bytes [lo, hi) a (possibly strided) view's elements reach, as uint8."""
    if view.flags.c_contiguous:
        return view.reshape(-1).view(np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))


class Isolated:
    """The worker process and the arena it shares; one dispatch at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._arena = Arena()
        self._arena_sent = False
        self._tokens: OrderedDict[Program, int] = OrderedDict()
        self._next_token = 0
        self._cancelled = False

    # --- the worker ----------------------------------------------------------------------

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        package_root = str(Path(__file__).parents[3])
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [
            env.get("PYTHONPATH")])])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mtwork.backends.sim.worker", str(child.fileno())],
            pass_fds=[child.fileno()], env=env, start_new_session=True,
            stdin=subprocess.DEVNULL)
        child.close()
        self._sock = parent
        self._arena_sent = False
        self._tokens.clear()

    def _stop(self) -> int | None:
        """Ends the worker at once; returns how it ended (a negative signal number)."""
        proc, sock = self._proc, self._sock
        self._proc, self._sock = None, None
        if sock is not None:
            sock.close()
        if proc is None:
            return None
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
        with self._lock:
            self._stop()
            self._arena.close()

    # --- one dispatch --------------------------------------------------------------------

    def dispatch(self, program: Program, call: Dispatch) -> Completion:
        # The watchdog's limit is read here, where the caller's environment is: a worker
        # keeps the environment it started with.
        if call.options.timeout is None:
            call = dataclasses.replace(call, options=dataclasses.replace(
                call.options, timeout=runtime.default_timeout()))
        with self._lock:
            self._cancelled = False
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            request, copies = self._request(program, call)
            fds = [] if self._arena_sent else [self._arena.fd]
            try:
                send(self._sock, request, fds)  # type: ignore[arg-type]
                self._arena_sent = True
                reply = self._wait(program, call)
            except KeyboardInterrupt:
                self._stop()
                raise
            except (ChannelClosed, OSError):
                status = self._stop()
                if self._cancelled:
                    raise KernelCancelled(program.label, "stopped before it ended") from None
                raise KernelFault(program.label, _death(status)) from None
            return self._completion(reply, copies, call)

    def _request(self, program: Program, call: Dispatch) -> tuple[dict[str, Any], dict]:
        """The message for the worker, with every buffer placed in the arena (copied in
        for bound ones), and what to copy back afterwards."""
        indices = sorted(call.buffers)
        sources: dict[int, np.ndarray] = {}
        placements: dict[int, Placement] = {}
        for index in indices:
            buf = call.buffers[index]
            if isinstance(buf, Fresh):
                dt = np.dtype(storage_numpy_dtype(buf.dtype))
                shape = tuple(buf.shape)
                placements[index] = Placement(0, math.prod(shape) * dt.itemsize, 0, shape,
                                              _c_strides(shape, dt.itemsize), dt.str)
            else:
                sources[index], placements[index] = _source_bytes(buf)
        owners = _owners(indices, placements, sources)
        placed = sorted(set(owners.values()))
        starts, guards, size = layout([placements[i].nbytes for i in placed])
        if self._arena.grow(size):
            self._arena_sent = False
        whole = np.frombuffer(self._arena.map, dtype=np.uint8)  # type: ignore[arg-type]
        start_of = dict(zip(placed, starts))
        for index in placed:
            if index in sources:
                start = start_of[index]
                whole[start : start + placements[index].nbytes] = sources[index]
        for index in indices:
            p = placements[index]
            placements[index] = Placement(start_of[owners[index]], p.nbytes, p.data, p.shape,
                                          p.strides, p.dtype)
        token = self._tokens.get(program)
        fresh_program = token is None
        if fresh_program:
            token = self._next_token
            self._next_token += 1
            self._tokens[program] = token
            if len(self._tokens) > _PROGRAMS_KEPT:
                self._tokens.popitem(last=False)
        # Sanitized, every access is checked before it happens (an out-of-bounds read is
        # reported, then goes on): guard pages would turn those reads into faults.
        guarded = [] if call.options.sanitize else guards
        request = {"token": token, "program": program if fresh_program else None,
                   "geometry": call.geometry, "options": call.options,
                   "threadgroup_memory": dict(call.threadgroup_memory), "guards": guarded,
                   "buffers": {i: (placements[i], _spec(call.buffers[i])) for i in indices}}
        return request, placements

    def _wait(self, program: Program, call: Dispatch) -> Any:
        limit = call.options.timeout
        grace = min(max(limit, _GRACE_BOUNDS[0]), _GRACE_BOUNDS[1])
        ready, _, _ = select.select([self._sock], [], [], limit + grace)
        if not ready:
            self._stop()
            raise KernelTimeout(program.label, f"no answer {limit + grace:g} s after it "
                                               f"started (the watchdog's {limit:g} s and "
                                               f"{grace:g} s of grace): the worker was ended")
        reply, _ = receive(self._sock)  # type: ignore[arg-type]
        return reply

    def _completion(self, reply: Any, placements: dict[int, Placement],
                    call: Dispatch) -> Completion:
        kind, value = reply
        if kind == "error":
            raise value
        written, report, used, engine, counters = value
        buffers = {}
        for index in written:
            arena_view = placements[index].view(self._arena.map)  # type: ignore[arg-type]
            buf = call.buffers[index]
            if isinstance(buf, Bound) and isinstance(buf.array, np.ndarray) and buf.writable:
                np.copyto(buf.array, arena_view)
                buffers[index] = buf.array
            else:
                buffers[index] = np.array(arena_view)
            del arena_view
        return Completion(buffers, report, used, engine, counters)


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
