"""A dispatch's log: the memory the runtime prints kernels' messages into (runtime.h's
`mtw_log_header`, then the records), and reading it back.

The log of a kernel run in the worker process lies in the arena it shares with mtwork, so
that mtwork reads the messages of a dispatch whose worker died. Its size is
$MTWORK_LOG_BUFFER_SIZE bytes (1 KiB to 1 GiB, as Metal's ``MTL_LOG_BUFFER_SIZE``), 1 MiB
by default (Metal's ``MTLLogStateDescriptor.bufferSize``'s default); when it is full,
later messages are dropped and counted, as on Metal.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .abi import LOG_LEVELS, LogHeader, LogRecord

__all__ = ["DEFAULT_BYTES", "HEADER_BYTES", "LogBuffer", "RawLog", "RawMessage", "buffer_size",
           "give", "take"]

DEFAULT_BYTES = 1 << 20
MIN_BYTES, MAX_BYTES = 1 << 10, 1 << 30
HEADER_BYTES = _HEADER = ctypes.sizeof(LogHeader)
_RECORD = struct.Struct("<II3I3IIIBB5H")
_HEAD = struct.Struct("<II")  # a record's serial and size
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


class RawMessage(NamedTuple):
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


_LEVELS = LOG_LEVELS


class LogBuffer:
    """A log over `memory` (bytes: a header, then room for records)."""

    def __init__(self, memory: np.ndarray) -> None:
        if memory.dtype != np.uint8 or memory.ndim != 1 or memory.size < _HEADER + MIN_BYTES:
            raise ValueError("a log needs one-dimensional uint8 memory of at least "
                             f"{_HEADER + MIN_BYTES} bytes")
        self.memory = memory
        self.address = memory.ctypes.data  # the header's, for the launch record
        self.header = LogHeader.from_address(self.address)

    @classmethod
    def over(cls, buffer: Any, offset: int, room: int) -> LogBuffer:
        """The log at `offset` of `buffer` (the arena's mapping), `room` bytes of records
        after its header."""
        return cls(np.frombuffer(buffer, np.uint8, count=_HEADER + room, offset=offset))

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
        if not end:
            return RawLog((), capacity, dropped=int(h.dropped), truncated=int(h.truncated))
        data = self.memory[_HEADER:_HEADER + end].tobytes()  # one copy, then parsed
        # File names, subsystems and categories: few, and the same in many records.
        known: dict[bytes, tuple[str, str, str]] = {}
        messages, offset, incomplete = [], 0, False
        while offset + _HEAD.size <= end:
            record_serial, size = _HEAD.unpack_from(data, offset)
            if record_serial == serial and size == 0:
                break  # where a full log's records end
            if (record_serial != serial or size < _RECORD.size
                    or offset + size > capacity):
                incomplete = True  # its writer died before it finished
                break
            (_, _, gx, gy, gz, tx, ty, tz, index, line, level, cut, file_n, sub_n, cat_n,
             text_n, _) = _RECORD.unpack_from(data, offset)
            at = offset + _RECORD.size
            names_end = at + file_n + sub_n + cat_n
            key = data[at - 6:names_end]  # the three lengths and the names
            named = known.get(key)
            if named is None:
                named = known[key] = tuple(
                    data[a:b].decode("utf-8", errors="replace") for a, b in (
                        (at, at + file_n), (at + file_n, at + file_n + sub_n),
                        (at + file_n + sub_n, names_end)))
            messages.append(RawMessage(
                len(messages), (gx, gy, gz), (tx, ty, tz), index,
                _LEVELS[level] if level < len(_LEVELS) else "default", named[0], line,
                named[1], named[2], data[names_end:names_end + text_n].decode(
                    "utf-8", errors="replace"), bool(cut)))
            offset += size
        return RawLog(tuple(messages), capacity, dropped=int(h.dropped),
                      truncated=int(h.truncated), incomplete=incomplete)


_kept: list[LogBuffer] = []
_kept_lock = threading.Lock()
_KEPT = 4


def take(size: int) -> LogBuffer:
    """A log of `size` bytes of room for one dispatch of this process, reset: one of the
    few kept (`give` them back), or a new one (whose pages cost nothing until a kernel
    writes them)."""
    with _kept_lock:
        for k, log in enumerate(_kept):
            if log.memory.size - _HEADER == size:
                del _kept[k]
                break
        else:
            log = None
    if log is None:
        log = LogBuffer(np.zeros(_HEADER + size, np.uint8))
    log.reset()
    return log


def give(log: LogBuffer) -> None:
    """Returns a log `take` gave, once its dispatch's messages are read."""
    with _kept_lock:
        if len(_kept) < _KEPT:
            _kept.append(log)
