"""The emulator runtime's C interface, as ctypes sees it: the records a dispatch passes
(`LaunchRecord`, `BufferInfo`) and gets back (`Finding`, `LiveThreadRecord`, the log's
`LogHeader` and `LogRecord`s), the library's function signatures (`runtime_handle`), and
the sanitizer's kinds of finding from the runtime's own table. Mirrors runtime/runtime.h
and include/mtw_abi.h."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import cache

from ....errors import EmulatorUnavailable
from ..compile.compiler import runtime_library

ABI_VERSION = 5


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
        ("callers", ctypes.c_uint64 * 6),  # MTW_FINDING_CALLERS
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


class LiveThreadRecord(ctypes.Structure):
    _fields_ = [
        ("group", ctypes.c_uint32 * 3),
        ("thread", ctypes.c_uint32 * 3),
        ("state", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("pc", ctypes.c_uint64),
    ]



class LogHeader(ctypes.Structure):
    """The head of a dispatch's log (mtw_log_header); records follow it."""

    _fields_ = [
        ("serial", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("capacity", ctypes.c_uint64),
        ("used", ctypes.c_uint64),
        ("messages", ctypes.c_uint64),
        ("dropped", ctypes.c_uint64),
        ("truncated", ctypes.c_uint64),
    ]


class LogRecord(ctypes.Structure):
    """One message (mtw_log_record); the file's name, subsystem, category and text
    follow it, unterminated."""

    _fields_ = [
        ("serial", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("group", ctypes.c_uint32 * 3),
        ("thread", ctypes.c_uint32 * 3),
        ("index", ctypes.c_uint32),
        ("line", ctypes.c_uint32),
        ("level", ctypes.c_uint8),
        ("cut", ctypes.c_uint8),
        ("file_bytes", ctypes.c_uint16),
        ("subsystem_bytes", ctypes.c_uint16),
        ("category_bytes", ctypes.c_uint16),
        ("text_bytes", ctypes.c_uint16),
        ("reserved", ctypes.c_uint16),
    ]


LOG_TEXT_MAX = 1024  # MTW_LOG_TEXT_MAX: a message's text is cut there, as Metal's is
LOG_LEVELS = ("default", "debug", "info", "error", "fault")  # mtw_log_level


class LaunchRecord(ctypes.Structure):
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
        ("lockstep", ctypes.c_uint32),
        ("buffer_info", ctypes.c_void_p),
        ("nbuffers", ctypes.c_uint32),
        ("max_findings", ctypes.c_uint32),
        ("findings", ctypes.c_void_p),
        ("groups", ctypes.c_void_p),
        ("ngroups", ctypes.c_uint64),
        ("log", ctypes.c_void_p),
    ]


@cache
def runtime_handle() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)
    lib.mtw_dispatch_start.argtypes = [ctypes.POINTER(LaunchRecord)]
    lib.mtw_dispatch_start.restype = ctypes.c_int
    lib.mtw_dispatch_wait.argtypes = [ctypes.c_uint32]
    lib.mtw_dispatch_wait.restype = ctypes.c_int
    lib.mtw_dispatch_cancel.argtypes = []
    lib.mtw_dispatch_message.restype = ctypes.c_char_p
    lib.mtw_dispatch_live_threads.argtypes = [ctypes.POINTER(LiveThreadRecord), ctypes.c_uint32]
    lib.mtw_dispatch_live_threads.restype = ctypes.c_uint64
    lib.mtw_dispatch_tg_memory.restype = ctypes.c_uint32
    lib.mtw_sanitizer_findings.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_arrays.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_array_name.restype = ctypes.c_char_p
    lib.mtw_sanitizer_tg_array_name.argtypes = [ctypes.c_uint32]
    lib.mtw_sanitizer_tg_array_element_size.restype = ctypes.c_uint32
    lib.mtw_sanitizer_tg_array_element_size.argtypes = [ctypes.c_uint32]
    for name in ("mtw_finding_kind_name", "mtw_finding_kind_text"):
        getattr(lib, name).restype = ctypes.c_char_p
        getattr(lib, name).argtypes = [ctypes.c_uint32]
    if lib.mtw_abi_version() != ABI_VERSION:
        raise EmulatorUnavailable("the emulator runtime library does not match this mtwork")
    return lib


@dataclass(frozen=True)
class FindingKind:
    """One kind of sanitizer finding, from the runtime's table (MTW_FINDING_KINDS)."""

    code: int
    name: str  # e.g. "OUT_OF_BOUNDS"
    text: str  # e.g. "out-of-bounds access"


@cache
def finding_kinds() -> dict[str, FindingKind]:
    """Every kind of finding, by name."""
    rt, kinds = runtime_handle(), {}
    for code in range(1, 64):
        name = rt.mtw_finding_kind_name(code)
        if name:
            kinds[name.decode()] = FindingKind(code, name.decode(),
                                               rt.mtw_finding_kind_text(code).decode())
    return kinds


def runtime_loaded() -> bool:
    """Whether this process has loaded the runtime (nothing can run before it has)."""
    return runtime_handle.cache_info().currsize > 0
