"""The emulator's worker process: runs kernels on the arena it shares with mtwork.

Started by `isolation.Isolated` as ``python -m mtwork.backends.sim.worker FD``, where FD
is its end of a Unix socket. Each request names a kernel (its `Program`, sent once, then
a token), the placement of every buffer in the arena and the dispatch's geometry and
options; the reply is the buffers written, the sanitizer's report, the threadgroup
memory used, the engine that ran it and the profiler's counters, or the exception the
dispatch raised. Guard pages around the buffers are made inaccessible for the call, so a
write past a buffer's end faults at once.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from ...dispatch import Bound, Dispatch, Fresh, Program
from ...errors import KernelFault
from . import SimBackend
from .arena import Arena, Placement
from .channel import ChannelClosed, receive, send


def _run(backend: SimBackend, arena: Arena, programs: dict[int, Program],
         request: dict[str, Any]) -> tuple:
    if request["program"] is not None:
        programs[request["token"]] = request["program"]
    program = programs[request["token"]]
    views: dict[int, Any] = {}
    buffers: dict[int, Bound | Fresh] = {}
    for index, (placement, spec) in request["buffers"].items():
        placement: Placement
        views[index] = placement.view(arena.map)  # type: ignore[arg-type]
        if spec[0] == "fresh":
            buffers[index] = spec[1]
        else:
            _, dtype, writable = spec
            buffers[index] = Bound(views[index], dtype, writable=writable, contiguous=False)
    call = Dispatch(buffers, request["geometry"], request["options"],
                    request["threadgroup_memory"])
    arena.guard(request["guards"])
    try:
        done = backend.dispatch_here(program, call, place=lambda i, _fresh: views[i])
    finally:
        views.clear()
        arena.guard([])
    return (sorted(done.buffers), done.sanitizer, done.threadgroup_memory, done.engine,
            done.counters)


def _reply_error(sock: socket.socket, exc: BaseException) -> None:
    try:
        send(sock, ("error", exc))
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        send(sock, ("error", KernelFault("<worker>", f"{type(exc).__name__}: {exc}")))


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    backend, arena, programs = SimBackend(), Arena(), {}
    while True:
        try:
            request, fds = receive(sock)
        except ChannelClosed:
            return
        if fds:
            arena.attach(fds[0])
        try:
            send(sock, ("ok", _run(backend, arena, programs, request)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to mtwork
            _reply_error(sock, exc)


if __name__ == "__main__":
    main(int(sys.argv[1]))
