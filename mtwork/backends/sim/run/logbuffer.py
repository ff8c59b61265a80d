"""A dispatch's log: the memory the runtime prints kernels' messages into (runtime.h's
`mtw_log_header`, then the records), and reading it back.

The log of a kernel run in the worker process lies in the arena it shares with mtwork, so
that mtwork reads the messages of a dispatch whose worker died. Its size is
$MTWORK_LOG_BUFFER_SIZE bytes (1 KiB to 1 GiB, as Metal's ``MTL_LOG_BUFFER_SIZE``), 1 MiB
by default (Metal's ``MTLLogStateDescriptor.bufferSize``'s default); when it is full,
later messages are dropped and counted, as on Metal.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .abi import LOG_LEVELS, LogHeader, LogRecord

__all__ = ["DEFAULT_BYTES", "HEADER_BYTES", "LogBuffer", "RawLog", "RawMessage", "borrowed",
           "buffer_size"]

DEFAULT_BYTES = 1 << 20
MIN_BYTES, MAX_BYTES = 1 << 10, 1 << 30
HEADER_BYTES = _HEADER = ctypes.sizeof(LogHeader)
_RECORD = struct.Struct("<II3I3IIIBB5H")
assert _RECORD.size == ctypes.sizeof(LogRecord)


def buffer_size() -> int:
    """The log's bytes: $MTWORK_LOG_BUFFER_SIZE (1024 to 2**30), else 1 MiB."""
    value = os.environ.get("MTWORK_LOG_BUFFER_SIZE", "").strip()
    if not value:
        return DEFAULT_BYTES
    try:
        size = int(value)
    except ValueError:
        size = -1
    if not MIN_BYTES <= size <= MAX_BYTES:
        raise ValueError(f"MTWORK_LOG_BUFFER_SIZE must be a number of bytes from {MIN_BYTES} "
                         f"to {MAX_BYTES} (as Metal's MTL_LOG_BUFFER_SIZE), got {value!r}")
    return size


@dataclass(frozen=True)
class RawMessage:
    """One record as the runtime wrote it: `order` is its place in the log (a thread's
    messages are in the order it wrote them), `file` and `line` the call's place in the
    compiled source."""

    order: int
    group: tuple[int, int, int]
    thread: tuple[int, int, int]
    index: int
    level: str
    file: str
    line: int
    subsystem: str
    category: str
    text: str
    cut: bool


@dataclass(frozen=True)
class RawLog:
    """A dispatch's messages and what did not make it: messages dropped when the log was
    full, texts cut at 1024 bytes, and whether a record was left half written (the
    process writing it died)."""

    messages: tuple[RawMessage, ...]
    capacity: int
    dropped: int = 0
    truncated: int = 0
    incomplete: bool = False


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


class LogBuffer:
    """A log over `memory` (bytes: a header, then room for records)."""

    def __init__(self, memory: np.ndarray) -> None:
        if memory.dtype != np.uint8 or memory.ndim != 1 or memory.size < _HEADER + MIN_BYTES:
            raise ValueError("a log needs one-dimensional uint8 memory of at least "
                             f"{_HEADER + MIN_BYTES} bytes")
        self.memory = memory
        self.header = LogHeader.from_address(memory.ctypes.data)

    @classmethod
    def over(cls, buffer: Any, offset: int, room: int) -> LogBuffer:
        """The log at `offset` of `buffer` (the arena's mapping), `room` bytes of records
        after its header."""
        return cls(np.frombuffer(buffer, np.uint8, count=_HEADER + room, offset=offset))

    @property
    def address(self) -> int:
        """The header's address, for the launch record."""
        return self.memory.ctypes.data

    def reset(self) -> None:
        """Empties the log for a new dispatch: a new serial, so that records of an earlier
        one are never read as this one's."""
        h = self.header
        h.serial = (h.serial + 1) & 0xFFFFFFFF or 1
        h.capacity = self.memory.size - _HEADER
        h.used = h.messages = h.dropped = h.truncated = 0

    def read(self) -> RawLog:
        """The complete records, in the order they were written."""
        h = self.header
        capacity, serial = int(h.capacity), int(h.serial)
        end = min(int(h.used), capacity)
        view = memoryview(self.memory)[_HEADER:]  # type: ignore[arg-type]
        messages, offset, incomplete = [], 0, False
        while offset < end:
            fields = _RECORD.unpack_from(view, offset)
            size = fields[1]
            if fields[0] != serial or size < _RECORD.size or offset + size > capacity:
                incomplete = True
                break
            lengths = fields[12:16]
            at = offset + _RECORD.size
            texts = []
            for n in lengths:
                texts.append(_text(bytes(view[at:at + n])))
                at += n
            messages.append(RawMessage(
                order=len(messages), group=fields[2:5], thread=fields[5:8], index=fields[8],
                level=LOG_LEVELS[fields[10]] if fields[10] < len(LOG_LEVELS) else "default",
                file=texts[0], line=fields[9], subsystem=texts[1], category=texts[2],
                text=texts[3], cut=bool(fields[11])))
            offset += size
        return RawLog(tuple(messages), capacity, dropped=int(h.dropped),
                      truncated=int(h.truncated), incomplete=incomplete)


_kept: list[LogBuffer] = []
_kept_lock = threading.Lock()
_KEPT = 4


@contextlib.contextmanager
def borrowed(size: int) -> Iterator[LogBuffer]:
    """A log of `size` bytes of room for this process's dispatch, reset, from the few
    kept (untouched pages of a new one cost nothing until a kernel writes them)."""
    with _kept_lock:
        log = next((b for b in _kept if b.memory.size - _HEADER == size), None)
        if log is not None:
            _kept.remove(log)
    if log is None:
        log = LogBuffer(np.zeros(_HEADER + size, np.uint8))
    log.reset()
    try:
        yield log
    finally:
        with _kept_lock:
            if len(_kept) < _KEPT:
                _kept.append(log)
