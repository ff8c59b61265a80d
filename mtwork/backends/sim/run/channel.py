"""The messages between mtwork and the emulator's worker process, over a Unix socket:
pickled objects, each behind its length, with file descriptors (shared memory segments)
passed alongside when there are any."""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

__all__ = ["MAX_FDS", "PLANS_KEPT", "PROGRAMS_KEPT", "ChannelClosed", "receive", "send"]

_HEADER = struct.Struct("!Q")
_FIRST_READ = 4096  # bytes: a request or reply of a cached call, and its header
# File descriptors one message may carry: a segment for each of a call's buffers (Metal
# has 31 slots) and its staging blocks.
MAX_FDS = 64

# How many kernel descriptions and call plans the worker keeps by default, by id: mtwork
# tells it which ones to let go, so both sides hold the same ones.
PROGRAMS_KEPT = 256
PLANS_KEPT = 1024


class ChannelClosed(EOFError):
    """The other side is gone."""


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
    # One write for the header and the payload: the other side wakes once, with the
    # whole message there to read.
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(sock, [data], list(fds)) if fds else 0
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> tuple[Any, list[int]]:
    """The next message and the file descriptors that came with it. One read takes a
    small message whole: the two sides take turns, so nothing follows it."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _FIRST_READ, MAX_FDS)
    if not data:
        raise ChannelClosed("the other side closed the channel")
    if len(data) < _HEADER.size:
        data += _exactly(sock, _HEADER.size - len(data))
    (length,) = _HEADER.unpack_from(data)
    end = _HEADER.size + length
    if len(data) < end:
        data += _exactly(sock, end - len(data))
    elif len(data) > end:
        raise ChannelClosed("the other side sent a second message before this one's reply")
    return pickle.loads(memoryview(data)[_HEADER.size : end]), fds
