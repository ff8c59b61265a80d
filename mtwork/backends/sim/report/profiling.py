"""The profiler's side of a sim dispatch: the runtime's counting armed for one launch
(runtime/profiler.cpp), and what it counted turned into `mtwork.gpu.Counters` at the
author's source lines.

The runtime gives, per instrumented block, its executions (summed over threads), its
SIMD-group issues and its threadgroup issues; `instrument.Table` says what one execution
of each block does, so operations, SIMD-group operations, barriers and SIMD efficiency
are sums of products. Memory comes per code address and buffer (or threadgroup memory),
already counted per SIMD-group access; the symbolizer names each address's source line.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from ....buffers import byte_span
from ....dispatch import Geometry, Sources
from ....errors import EmulatorUnavailable
from ....gpu.catalog import default_gpu
from ....gpu.counters import BufferTraffic, Counters, LaneOps, SimdOps, SourceLine
from ..compile.compiler import runtime_library
from ..count.instrument import Table, author_place
from ..run import abi, runtime
from ..run.memory import Memory
from .symbolizer import symbolize

__all__ = ["KIND_ATOMIC", "KIND_LOAD", "KIND_STORE", "RANGE", "THREADGROUP", "Profiled", "Site",
           "counters", "counting", "line_bytes", "load_table"]

# Apple GPUs give a thread at most 128 32-bit registers (Alyssa Rosenzweig, "Dissecting
# the Apple M1 GPU, part III"); a kernel that needs more spills.
MAX_REGISTERS = 128
_MAX_SITES = 1 << 14  # (code address, buffer, kind) triples a dispatch may have
THREADGROUP = -1
KIND_LOAD, KIND_STORE, KIND_ATOMIC = 0, 1, 2  # mtw_access_kind
_INCOMPLETE = 0xFFFFFFFF
_lock = threading.Lock()  # the runtime has one profiler: one profiled dispatch at a time


class Site(ctypes.Structure):
    _fields_ = [("pc", ctypes.c_uint64), ("buffer", ctypes.c_int32), ("kind", ctypes.c_uint32),
                ("accesses", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("lines", ctypes.c_uint64), ("wavefronts", ctypes.c_uint64),
                ("conflicts", ctypes.c_uint64)]


class _Profile(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("buffers", ctypes.c_void_p),
                ("nbuffers", ctypes.c_uint32), ("line_bytes", ctypes.c_uint32),
                ("threads", ctypes.c_uint32), ("blocks", ctypes.c_uint32),
                ("branches", ctypes.c_uint32), ("max_sites", ctypes.c_uint32),
                ("block_lanes", ctypes.c_void_p), ("block_simd", ctypes.c_void_p),
                ("block_groups", ctypes.c_void_p), ("divergences", ctypes.c_void_p),
                ("distinct_lines", ctypes.c_void_p), ("sites", ctypes.c_void_p),
                ("ranges", ctypes.c_void_p), ("max_ranges", ctypes.c_uint64),
                ("range_count", ctypes.c_void_p), ("nslots", ctypes.c_uint32),
                ("slot_group", ctypes.c_void_p), ("slot_site_count", ctypes.c_void_p),
                ("slot_checked", ctypes.c_void_p), ("slot_hashes", ctypes.c_void_p)]


# mtw_profile_range: one byte range of a SIMD-group access of device memory.
RANGE = np.dtype([("pc", np.uint64), ("buffer", np.int32), ("kind", np.uint32),
                  ("access", np.uint64), ("lo", np.uint64), ("hi", np.uint64),
                  ("slot", np.uint32), ("reserved", np.uint32)])


@cache
def _profiler() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)
    lib.mtw_profile_arm.argtypes = [ctypes.POINTER(_Profile)]
    lib.mtw_profile_arm.restype = ctypes.c_int
    lib.mtw_profile_collect.restype = ctypes.c_uint32
    lib.mtw_profile_disarm.restype = None
    lib.mtw_profile_message.restype = ctypes.c_char_p
    return lib


def load_table(library: Path) -> Table:
    """The table of a profiled library (kept beside it by compiler.compile_kernel)."""
    return Table.from_json(json.loads(library.with_name("table.json").read_text()))


def _array(kind, n: int) -> ctypes.Array:
    return (kind * max(1, n))()


@dataclass
class Profiled:
    """What the runtime counted for one dispatch (or one threadgroup of it)."""

    names: list[str]  # the buffers, by the runtime's index
    lanes: list[int]  # per instrumented block: executions, summed over threads
    simd: list[int]  # SIMD-group issues
    groups: list[int]  # threadgroup issues
    divergences: list[int]  # per instrumented branch: issues whose lanes went both ways
    distinct_lines: list[int]  # per buffer
    sites: list[Site] = field(default_factory=list)
    # Asked for (`counting(ranges=...)`): every device access's byte ranges (`RANGE`).
    ranges: np.ndarray | None = None
    sizes: list[int] = field(default_factory=list)  # the buffers' bytes, by index
    # Counted apart: whether only checked (its threadgroup-memory accesses and branches
    # hashed, not counted), and its hashes of those (threadgroup memory, branches).
    checked: bool = False
    hashes: tuple[int, int] = (0, 0)


def _buffers(memory: Memory) -> tuple[ctypes.Array, list[str]]:
    """Every buffer of the dispatch whose reads are device memory traffic (the body
    form's shape and stride buffers too: MLX passes them as buffers), for the runtime to
    tell accesses apart. A `constant T&` argument is not one: the host sets its bytes
    (`setBytes`) and a thread reads one value, which Apple's GPU keeps in uniform
    registers or its constant cache, not in the L1 or DRAM the model charges."""
    params = [p for p in memory.program.params
              if p.kind == "buffer" and not _constant_value(p.type_text)
              and p.index in memory.arrays and memory.arrays[p.index].size]
    infos = (abi.BufferInfo * max(1, len(params)))()
    for info, p in zip(infos, params):
        arr = memory.arrays[p.index]
        lo, hi = byte_span(arr)
        info.base, info.size = lo, hi - lo
        info.element_size = max(1, arr.itemsize)
        info.kind = abi.BUFFER_INPUT
        info.name = p.name.encode()
    return infos, [p.name for p in params]


def _constant_value(type_text: str) -> bool:
    """Whether a buffer parameter is a `constant` reference (a value, not an array):
    `constant int&`, and `const constant int&` or `constant const int&` as MLX and
    llama.cpp spell it."""
    text = type_text.strip()
    return text.endswith("&") and "constant" in text.split()[:2]


@contextmanager
def counting(library: runtime.KernelLibrary, table: Table, memory: Memory,
             geometry: Geometry, *, ranges: int = 0, apart: Sequence[int] = (),
             checked: Sequence[bool] = ()) -> Iterator[list[Profiled]]:
    """Arms the runtime's profiler for the dispatch run inside the block; afterwards the
    list it yields holds the counts: of the whole dispatch, or of each threadgroup in
    `apart` (linear indices; the dispatch must run only those; `checked`: which of them
    are only checked against another, their threadgroup-memory accesses and branches
    hashed and not counted), and with `ranges` (room for that many) the byte ranges of
    every device access. One profiled dispatch at a time."""
    rt = _profiler()
    infos, names = _buffers(memory)
    blocks, branches, slots = len(table.blocks), len(table.branches), max(1, len(apart))
    arrays = {k: _array(ctypes.c_uint64, n * slots) for k, n in (
        ("lanes", blocks), ("simd", blocks), ("groups", blocks), ("divergences", branches))}
    distinct = _array(ctypes.c_uint64, len(names))
    # zeroed pages from the system, touched only where sites are written (a ctypes array
    # is cleared byte by byte: milliseconds for each slot's table)
    site_memory = np.zeros(ctypes.sizeof(Site) * _MAX_SITES * slots, np.uint8)
    sites = (Site * (_MAX_SITES * slots)).from_buffer(site_memory)
    site_count = _array(ctypes.c_uint32, slots)
    recorded = np.empty(ranges, RANGE)  # pages are touched only as ranges are written
    range_count = ctypes.c_uint64(0)
    chosen = _array(ctypes.c_uint64, len(apart))
    chosen[:len(apart)] = list(apart)
    only_checked = _array(ctypes.c_uint8, len(apart))
    only_checked[:len(checked)] = [int(c) for c in checked]
    hashes = _array(ctypes.c_uint64, 2 * len(apart))
    profile = _Profile(
        entry=library.entry, buffers=ctypes.cast(infos, ctypes.c_void_p).value,
        nbuffers=len(names), line_bytes=line_bytes(),
        threads=min(geometry.threads_per_threadgroup, math.prod(geometry.grid)),
        blocks=blocks, branches=branches, max_sites=_MAX_SITES,
        block_lanes=ctypes.addressof(arrays["lanes"]),
        block_simd=ctypes.addressof(arrays["simd"]),
        block_groups=ctypes.addressof(arrays["groups"]),
        divergences=ctypes.addressof(arrays["divergences"]),
        distinct_lines=ctypes.addressof(distinct), sites=ctypes.addressof(sites),
        ranges=recorded.ctypes.data if ranges else None, max_ranges=ranges,
        range_count=ctypes.addressof(range_count), nslots=len(apart),
        slot_group=ctypes.addressof(chosen), slot_site_count=ctypes.addressof(site_count),
        slot_checked=ctypes.addressof(only_checked), slot_hashes=ctypes.addressof(hashes))
    out: list[Profiled] = []
    with _lock:
        if rt.mtw_profile_arm(ctypes.byref(profile)) != 0:
            raise EmulatorUnavailable(f"the profiler cannot run: "
                                      f"{rt.mtw_profile_message().decode()}")
        try:
            yield out
        except BaseException:
            rt.mtw_profile_disarm()
            raise
        found = rt.mtw_profile_collect()
    if found == _INCOMPLETE:
        raise EmulatorUnavailable(rt.mtw_profile_message().decode())
    if found > _MAX_SITES:
        raise EmulatorUnavailable(f"the profiler counted {found} access sites, more than the "
                                  f"{_MAX_SITES} it reports; profile a smaller kernel")
    short = ranges and range_count.value > ranges  # the record of ranges is short: None
    kept = recorded[:range_count.value] if ranges and not short else None
    for k in range(slots):
        per = {name: list(a[k * n:(k + 1) * n]) for name, a, n in (
            ("lanes", arrays["lanes"], blocks), ("simd", arrays["simd"], blocks),
            ("groups", arrays["groups"], blocks),
            ("divergences", arrays["divergences"], branches))}
        count = site_count[k] if apart else found
        mine = None if kept is None else kept[kept["slot"] == k] if apart else kept
        out.append(Profiled(names, distinct_lines=list(distinct[:len(names)]),
                            sites=list(sites[k * _MAX_SITES:k * _MAX_SITES + count]),
                            ranges=mine, sizes=[int(i.size) for i in infos],
                            checked=bool(only_checked[k]) if apart else False,
                            hashes=(hashes[2 * k], hashes[2 * k + 1]) if apart else (0, 0),
                            **per))


def line_bytes() -> int:
    """The granule device accesses are counted in: what the L1 of the chip the counts are
    for ($MTWORK_GPU's) moves per cycle, 64 bytes (half a 128-byte line) on every chip in
    the table. An access that uses part of a line costs the segments it touches, not the
    whole line (mtwork.gpu.model's cache term)."""
    return default_gpu().l1_bytes_per_core_cycle


@lru_cache(maxsize=256)
def _places(library: Path, offsets: tuple[int, ...], sources: Sources
            ) -> dict[int, tuple[str, int]]:
    """The author's source line of each code offset that has one."""
    place = author_place(sources)
    found = {}
    for offset, frames in symbolize(library, offsets).items():
        for file, line, _column in frames:  # innermost first
            where = place(file, line)
            if where is not None:
                found[offset] = where
                break
    return found


def _work(table: Table, raw: Profiled, lines: defaultdict) -> tuple[dict, dict, list[int]]:
    """Lane operations, SIMD-group operations and (barriers, SIMD issues, active lanes,
    issues on the critical path, load issues, loads on the chain of dependent loads) of
    the blocks; per-line operations and divergences go into `lines`."""
    ops, simd = Counter(), Counter()
    barriers = issues = active = load_issues = 0
    dependent = dependent_loads = 0.0
    for b, work in enumerate(table.blocks):
        lanes, simd_issues = raw.lanes[b], raw.simd[b]
        for cls, n in work.ops.items():
            ops[cls] += n * lanes
        for cls, n in work.simd.items():
            simd[cls] += n * simd_issues
        barriers += work.barriers * raw.groups[b]
        alu = sum(work.ops.values())
        issues += alu * simd_issues
        active += alu * lanes
        dependent += work.chain * simd_issues
        load_issues += work.loads * simd_issues
        dependent_loads += work.load_chain * simd_issues
        for where, n in work.lines.items():
            lines[where]["lane_ops"] += n * lanes
    for branch, where in enumerate(table.branches):
        if where is not None:
            lines[where]["divergences"] += raw.divergences[branch]
    return dict(ops), dict(simd), [barriers, issues, active, round(dependent), load_issues,
                                   round(dependent_loads)]


def _memory(raw: Profiled, places: dict[int, tuple[str, int]], lines: defaultdict
            ) -> tuple[list[BufferTraffic], Counter]:
    """Per buffer traffic, and the threadgroup-memory totals; per-line memory into `lines`."""
    per_buffer: dict[int, Counter] = defaultdict(Counter)
    shared = Counter()
    for s in raw.sites:
        where = places.get(int(s.pc))
        if s.buffer == THREADGROUP:
            if s.kind == KIND_ATOMIC:
                shared["threadgroup_atomics"] += s.accesses
                continue
            shared["threadgroup_accesses"] += s.wavefronts
            shared["bank_conflicts"] += s.conflicts
            if where is not None:
                lines[where]["threadgroup_accesses"] += s.wavefronts
                lines[where]["bank_conflicts"] += s.conflicts
            continue
        b = per_buffer[s.buffer]
        if s.kind == KIND_ATOMIC:
            b["atomics"] += s.accesses
            continue
        kind = "load" if s.kind == KIND_LOAD else "store"
        b[f"{kind}s"] += s.accesses
        b[f"{kind}_bytes"] += s.bytes
        b["transactions"] += s.lines
        if where is not None:
            lines[where]["device_bytes"] += s.bytes
            lines[where]["transactions"] += s.lines
    buffers = [BufferTraffic(name, distinct_lines=int(raw.distinct_lines[i]),
                             **{k: int(v) for k, v in per_buffer[i].items()})
               for i, name in enumerate(raw.names) if i in per_buffer]
    return buffers, shared


def counters(kernel: str, sources: Sources, library: Path, table: Table, raw: Profiled,
             geometry: Geometry, threadgroup_memory: int) -> Counters:
    """The `Counters` of one profiled dispatch."""
    lines: defaultdict = defaultdict(Counter)
    ops, simd, (barriers, issues, active, dependent, load_issues, dependent_loads) = _work(
        table, raw, lines)
    offsets = tuple(sorted({int(s.pc) for s in raw.sites}))
    buffers, shared = _memory(raw, _places(library, offsets, sources), lines)
    return Counters(
        kernel, threadgroups=math.prod(geometry.threadgroups),
        threads_per_threadgroup=geometry.threads_per_threadgroup,
        threadgroup_memory=threadgroup_memory,
        registers=min(table.registers, MAX_REGISTERS), line_bytes=line_bytes(),
        buffers=tuple(buffers), threadgroup_barriers=int(barriers),
        ops=LaneOps(**{k: int(v) for k, v in ops.items()}),
        simd=SimdOps(**{k: int(v) for k, v in simd.items()}),
        simd_issues=int(issues), active_lanes=int(active), dependent_issues=int(dependent),
        load_issues=int(load_issues), dependent_loads=int(dependent_loads),
        source_lines=_source_lines(lines), **{k: int(v) for k, v in shared.items()})


def _source_lines(lines: defaultdict) -> tuple[SourceLine, ...]:
    return tuple(SourceLine(line, file=file, **{k: int(v) for k, v in fields.items()})
                 for (file, line), fields in sorted(lines.items()) if any(fields.values()))
