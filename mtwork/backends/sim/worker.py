"""The emulator's worker process: runs kernels on the memory it shares with mtwork.

Started by `run.isolation.Isolated`, which runs `main(FD)` in a new interpreter, where FD
is its end of a Unix socket. Each request names a kernel (its `Program`, sent once, then
a token) and a plan (the dispatch's geometry and options, where every buffer sits in the
shared segments, what to open and zero; sent once, then an id), the ids mtwork no longer
uses, the segments whose file descriptors come with it and the segments mtwork unmapped;
the reply is the buffers written, the sanitizer's report, the threadgroup memory used, the
engine that ran it and the profiler's counters, or the exception the dispatch raised. The
kernel's messages go to the log the plan names, in shared memory, where mtwork reads them
(also when this process died).
Only the blocks a dispatch uses are accessible while it runs (`run.arena.WorkerMemory`),
so a write past a buffer's end, or into memory of another array, faults at once.
$MTWORK_WORKER_PROFILE names a file for the worker's cProfile statistics
(`bench/isolation_profile.py`).
"""

from __future__ import annotations

import atexit
import cProfile
import dataclasses
import os
import socket
import sys

import numpy as np

from ...dispatch import Bound, Dispatch, Fresh, Geometry, Options, Program
from ...errors import KernelFault
from . import SimBackend
from .run.arena import Placement, Range, WorkerMemory
from .run.channel import ChannelClosed, receive, send

Plan = tuple[Geometry, Options, float, tuple[tuple[int, int], ...], frozenset[Range],
             tuple[Range, ...], tuple[tuple[int, Placement, tuple], ...], tuple[int, ...],
             Placement | None]


class _Worker:
    """The kernels and plans mtwork has sent, and what each plan's calls reuse: its
    `Dispatch` over views of the shared memory."""

    def __init__(self) -> None:
        # The caller's process checked each program against Metal's rules before it sent
        # it here.
        self.backend = SimBackend(checks=False)
        self.memory = WorkerMemory()
        self.programs: dict[int, Program] = {}
        self.plans: dict[int, Plan] = {}
        self.calls: dict[int, tuple[Dispatch, dict[int, np.ndarray], np.ndarray | None]] = {}

    def segments(self, new: tuple[int, ...], fds: list[int], gone: tuple[int, ...]) -> None:
        """Maps the segments whose descriptors came (`new`), unmaps those mtwork let go."""
        if len(fds) != len(new):
            raise RuntimeError(f"expected {len(new)} shared segments, got {len(fds)}")
        if gone:
            self.calls.clear()  # views of an unmapped segment must go first
            for segment in gone:
                self.memory.detach(segment)
        for segment, fd in zip(new, fds):
            self.memory.attach(segment, fd)

    def run(self, request: tuple) -> tuple:
        token, program, plan_id, plan, forget, _new, _gone = request
        for old in forget:
            self.programs.pop(old, None)
            self.plans.pop(old, None)
            self.calls.pop(old, None)
        if program is not None:
            self.programs[token] = program
        if plan is not None:
            self.plans[plan_id] = plan
        call, views, log = self.calls.get(plan_id) or self._prepare(plan_id)
        _, _, _, _, opened, zeroed, _, _, _ = self.plans[plan_id]
        self.memory.open(opened, zeroed)
        done = self.backend.dispatch_here(self.programs[token], call,
                                          place=lambda i, _fresh: views[i], log_memory=log)
        engine = done.engine
        return (tuple(sorted(done.buffers)), done.sanitizer, done.threadgroup_memory,
                engine.name if engine else None, engine.reason if engine else None,
                done.counters)

    def _prepare(self, plan_id: int
                 ) -> tuple[Dispatch, dict[int, np.ndarray], np.ndarray | None]:
        geometry, options, timeout, threadgroup_memory, _, _, placed, unbound, log = (
            self.plans[plan_id])
        views: dict[int, np.ndarray] = {}
        buffers: dict[int, Bound | Fresh] = {}
        for index, placement, spec in placed:
            views[index] = self.memory.view(placement)
            if spec[0] == "fresh":
                buffers[index] = spec[1]
            else:
                _, dtype, writable = spec
                buffers[index] = Bound(views[index], dtype, writable=writable,
                                       contiguous=False)
        call = Dispatch(buffers, geometry, dataclasses.replace(options, timeout=timeout),
                        dict(threadgroup_memory), unbound)
        log_view = self.memory.view(log) if log is not None else None
        self.calls[plan_id] = call, views, log_view
        return call, views, log_view


def _reply_error(sock: socket.socket, exc: BaseException) -> None:
    try:
        send(sock, ("error", exc))
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        send(sock, ("error", KernelFault("<worker>", f"{type(exc).__name__}: {exc}")))


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    worker = _Worker()
    profile_to = os.environ.get("MTWORK_WORKER_PROFILE")
    if profile_to:  # cProfile statistics of this worker, written when it ends
        profiler = cProfile.Profile()
        profiler.enable()
        atexit.register(lambda: (profiler.disable(), profiler.dump_stats(profile_to)))
    while True:
        try:
            request, fds = receive(sock)
        except ChannelClosed:
            return
        try:
            worker.segments(request[5], fds, request[6])
            send(sock, ("ok", worker.run(request)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to mtwork
            _reply_error(sock, exc)


if __name__ == "__main__":
    main(int(sys.argv[1]))
