"""What one dispatch does to an Apple GPU, counted exactly: the input of `mtwork.gpu.model`.

An instrumented emulator fills a `Counters`; the units are chosen so it can count them
while running the kernel, without knowing the chip:

* **Device memory**, per buffer: bytes requested, i.e. for each SIMD-group access the
  bytes its active lanes touch (a word several lanes read counts once); SIMD-group access
  instructions; transactions, i.e. for each SIMD-group access the number of distinct
  `line_bytes`-sized granules ("lines") its active lanes touch, summed (so `requested /
  moved` is the coalescing efficiency); and the distinct lines touched over the whole
  dispatch (what reaches DRAM if caches keep every line until it is reused). The
  emulator counts in 64-byte granules, what a core's L1 moves per cycle (half a 128-byte
  cache line); counts made by hand may use whole 128-byte lines. Atomics are counted
  apart, per lane.
* **Threadgroup memory**: accesses in conflict-free wavefronts (one wavefront serves 32
  banks × 4 bytes) and bank conflicts as the extra wavefronts a SIMD-group access needs
  under that model (lanes reading the same word do not conflict).
* **Work**: thread-level operations by class (`LaneOps`), SIMD-group-level operations
  (`SimdOps`), threadgroup barriers passed (per threadgroup).
* **SIMD efficiency**: ALU instruction issues of SIMD-groups and the active lanes summed
  over them; divergence per source line.
* **ILP**: the issues on the kernel's longest dependency chains (`dependent_issues`, from
  the compiled code: backends/sim/count/ilp.py); issues / dependent issues is the ILP. The same
  over loads: SIMD-group load issues of the compiled code (`load_issues`) and those on
  its chains of dependent loads (`dependent_loads`); their ratio is the loads a
  SIMD-group has in flight at once (`loads_in_flight`).
* **Occupancy inputs**: the dispatch geometry, threadgroup memory and an estimate of the
  32-bit registers each thread needs (0 when unknown).

Counters of dispatches of one kernel with one geometry add up (`a + b`, `sum(...)`).
Everything is stored in a fixed order, so equal counts print identically.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..display import bytes_text, count_text, html_table, percent_text, text_table
from .records import build, check_keys, merge, unique_sorted

if TYPE_CHECKING:
    import plotly.graph_objects as go

SIMD_WIDTH = 32


@dataclass(frozen=True)
class LaneOps:
    """Thread-level operations (one per active lane) by class."""

    f32: int = 0  # FP32 add, mul, FMA, min/max, compare, select
    f16: int = 0  # the same in half precision
    bf16: int = 0  # bfloat arithmetic
    integer: int = 0  # integer add, sub, logic, compare, select
    integer_mul: int = 0  # integer multiply and multiply-add, variable shifts, bit fields
    exp_log: int = 0  # exp, exp2, log, log2 (and pow's two halves)
    recip_div: int = 0  # reciprocal and division
    sqrt_rsqrt: int = 0  # sqrt and rsqrt
    trig: int = 0  # sin, cos, tan
    convert: int = 0  # integer <-> float conversions, rint, floor, ceil, fract
    convert_float: int = 0  # conversions between float, half and bfloat

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class SimdOps:
    """SIMD-group-level operations: one per SIMD-group instruction, whatever the lanes."""

    shuffles: int = 0  # simd_shuffle*, simd_broadcast*, ballots and votes
    reductions: int = 0  # simd_sum/product/min/max/and/or/xor and prefix scans
    mma_f32: int = 0  # 8x8x8 simdgroup_multiply(_accumulate) on simdgroup_float8x8
    mma_f16: int = 0  # ... on simdgroup_half8x8
    mma_bf16: int = 0  # ... on simdgroup_bfloat8x8
    barriers: int = 0  # simdgroup_barrier


@dataclass(frozen=True)
class BufferTraffic:
    """Device-memory traffic of one buffer."""

    buffer: str
    load_bytes: int = 0  # per access, the bytes its active lanes touch (each byte once)
    store_bytes: int = 0
    loads: int = 0  # SIMD-group load instructions
    stores: int = 0  # SIMD-group store instructions
    transactions: int = 0  # lines touched per SIMD-group access, summed
    distinct_lines: int = 0  # lines touched at least once in the dispatch (atomics too)
    atomics: int = 0  # atomic operations (per lane)


@dataclass(frozen=True)
class SourceLine:
    """What one line of the kernel's source did. `file` names the author's file the line
    is in (a kernel's lines may come from several: the body form's ``header`` and
    ``source``, a library's included files); "" when there is one."""

    line: int
    device_bytes: int = 0
    transactions: int = 0
    threadgroup_accesses: int = 0
    bank_conflicts: int = 0
    lane_ops: int = 0
    divergences: int = 0  # times a SIMD-group's lanes took different paths here
    file: str = ""

    @property
    def place(self) -> str:
        return f"{self.file}:{self.line}" if self.file else str(self.line)


@dataclass(frozen=True)
class Counters:
    """The counts of one dispatch (or of `dispatches` identical ones). See the module."""

    kernel: str
    threadgroups: int
    threads_per_threadgroup: int
    threadgroup_memory: int = 0  # bytes per threadgroup
    registers: int = 0  # estimated 32-bit registers per thread; 0 = unknown
    dispatches: int = 1
    line_bytes: int = 128  # the granule of transactions and distinct lines (sim: 64)
    buffers: tuple[BufferTraffic, ...] = ()
    threadgroup_accesses: int = 0
    bank_conflicts: int = 0
    threadgroup_atomics: int = 0
    threadgroup_barriers: int = 0
    ops: LaneOps = field(default_factory=LaneOps)
    simd: SimdOps = field(default_factory=SimdOps)
    simd_issues: int = 0
    active_lanes: int = 0
    dependent_issues: int = 0  # issues on the critical path; 0 = not measured (ILP 1)
    load_issues: int = 0  # SIMD-group loads of memory in the compiled code
    dependent_loads: int = 0  # of those, on chains of dependent loads; 0 = not measured
    source_lines: tuple[SourceLine, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str):
            raise TypeError(f"Counters(kernel=...) must be a string, got {self.kernel!r}")
        object.__setattr__(self, "buffers",
                           unique_sorted(self.buffers, BufferTraffic, "buffers", "buffer"))
        object.__setattr__(self, "source_lines",
                           unique_sorted(self.source_lines, SourceLine, "source_lines",
                                         "file", "line"))
        for name, cls in (("ops", LaneOps), ("simd", SimdOps)):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"Counters({name}=...) must be a {cls.__name__}, "
                                f"got {getattr(self, name)!r}")
        for owner, name, value in _counts(self):
            _check_count(owner, name, value)
        for name in ("threadgroups", "threads_per_threadgroup", "dispatches", "line_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Counters({name}=...) must be at least 1, "
                                 f"got {getattr(self, name)}")
        if not self.simd_issues <= self.active_lanes <= SIMD_WIDTH * self.simd_issues:
            raise ValueError(f"Counters: active_lanes={self.active_lanes} must lie between "
                             f"simd_issues={self.simd_issues} (one lane per issue) and 32 × "
                             "simd_issues")
        self._check_chains()
        for b in self.buffers:
            if b.distinct_lines > b.transactions + b.atomics:
                raise ValueError(f"buffer `{b.buffer}`: distinct_lines={b.distinct_lines} > "
                                 f"transactions={b.transactions} + atomics={b.atomics}; "
                                 "every line touched is in a transaction or an atomic")
            if b.load_bytes + b.store_bytes > b.transactions * self.line_bytes:
                raise ValueError(f"buffer `{b.buffer}`: {b.load_bytes + b.store_bytes} bytes "
                                 f"requested but only {b.transactions} transactions of "
                                 f"{self.line_bytes} bytes moved")

    def _check_chains(self) -> None:
        if self.dependent_issues > self.simd_issues:
            raise ValueError(f"Counters: dependent_issues={self.dependent_issues} exceeds "
                             f"simd_issues={self.simd_issues} (ILP is at least 1)")
        if self.dependent_loads > self.load_issues:
            raise ValueError(f"Counters: dependent_loads={self.dependent_loads} exceeds "
                             f"load_issues={self.load_issues} (at least one load in flight)")

    # --- derived ---------------------------------------------------------------------------

    @property
    def requested_bytes(self) -> int:
        return sum(b.load_bytes + b.store_bytes for b in self.buffers)

    @property
    def moved_bytes(self) -> int:
        """Bytes the line-size transactions move (atomics not included)."""
        return sum(b.transactions for b in self.buffers) * self.line_bytes

    @property
    def distinct_bytes(self) -> int:
        return sum(b.distinct_lines for b in self.buffers) * self.line_bytes

    @property
    def coalescing(self) -> float:
        """Useful bytes / moved bytes (1.0 with no device traffic)."""
        return self.requested_bytes / self.moved_bytes if self.moved_bytes else 1.0

    @property
    def device_loads(self) -> int:
        return sum(b.loads for b in self.buffers)

    @property
    def device_atomics(self) -> int:
        return sum(b.atomics for b in self.buffers)

    @property
    def simdgroups_per_threadgroup(self) -> int:
        return math.ceil(self.threads_per_threadgroup / SIMD_WIDTH)

    @property
    def simd_efficiency(self) -> float:
        """Active lanes / 32 over ALU issues; without issue counts, the geometry's (a
        partial last SIMD-group of each threadgroup)."""
        if self.simd_issues:
            return self.active_lanes / (SIMD_WIDTH * self.simd_issues)
        return self.threads_per_threadgroup / (SIMD_WIDTH * self.simdgroups_per_threadgroup)

    @property
    def ilp(self) -> float:
        """Independent ALU instructions per step of the critical path (1.0 unmeasured)."""
        return self.simd_issues / self.dependent_issues if self.dependent_issues else 1.0

    @property
    def loads_in_flight(self) -> float | None:
        """Independent loads per step of the chain of dependent loads (None unmeasured)."""
        return self.load_issues / self.dependent_loads if self.dependent_loads else None

    @property
    def divergence_sites(self) -> tuple[SourceLine, ...]:
        return tuple(s for s in self.source_lines if s.divergences)

    # --- sums over dispatches ----------------------------------------------------------------

    def __add__(self, other: Counters) -> Counters:
        if not isinstance(other, Counters):
            return NotImplemented
        for name in ("kernel", "threads_per_threadgroup", "threadgroup_memory", "registers",
                     "line_bytes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise ValueError(f"cannot add counters with different {name} ({mine!r} vs "
                                 f"{theirs!r}): model those dispatches separately")
        summed = {name: getattr(self, name) + getattr(other, name)
                  for name in ("threadgroups", "dispatches", "threadgroup_accesses",
                               "bank_conflicts", "threadgroup_atomics",
                               "threadgroup_barriers", "simd_issues", "active_lanes",
                               "dependent_issues", "load_issues", "dependent_loads")}
        return replace(self, **summed, ops=_add_flat(self.ops, other.ops),
                       simd=_add_flat(self.simd, other.simd),
                       buffers=merge(self.buffers, other.buffers, "buffer"),
                       source_lines=merge(self.source_lines, other.source_lines, "file",
                                          "line"))

    def __radd__(self, other: object) -> Counters:
        if other == 0:  # sum() starts from 0
            return self
        return NotImplemented

    # --- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (ints and strings only) that `from_dict` turns back."""
        out = asdict(self)
        out["buffers"] = list(out["buffers"])
        out["source_lines"] = list(out["source_lines"])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counters:
        check_keys(cls, data, "Counters")
        data = dict(data)
        data["ops"] = build(LaneOps, data.get("ops", {}), "Counters.ops")
        data["simd"] = build(SimdOps, data.get("simd", {}), "Counters.simd")
        data["buffers"] = tuple(build(BufferTraffic, b, "Counters.buffers[]")
                                for b in data.get("buffers", ()))
        data["source_lines"] = tuple(build(SourceLine, s, "Counters.source_lines[]")
                                     for s in data.get("source_lines", ()))
        return cls(**data)

    # --- display -----------------------------------------------------------------------------

    def summary(self) -> str:
        regs = f"{self.registers} registers/thread" if self.registers else "registers unknown"
        dispatches = "1 dispatch" if self.dispatches == 1 else f"{self.dispatches} dispatches"
        return (f"`{self.kernel}`: {dispatches}, {self.threadgroups:,} "
                f"threadgroups × {self.threads_per_threadgroup} threads "
                f"({self.simdgroups_per_threadgroup} SIMD-groups), "
                f"{bytes_text(self.threadgroup_memory)} threadgroup memory, {regs}")

    def sections(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """(title, header, rows) of each table, shared by the text and HTML views."""
        buffer_rows = [[b.buffer, bytes_text(b.load_bytes), bytes_text(b.store_bytes),
                        count_text(b.loads + b.stores), count_text(b.transactions),
                        count_text(b.distinct_lines), count_text(b.atomics),
                        percent_text(_ratio(b.load_bytes + b.store_bytes,
                                              b.transactions * self.line_bytes))]
                       for b in self.buffers]
        memory = (f"device memory: {bytes_text(self.requested_bytes)} requested, "
                  f"{bytes_text(self.moved_bytes)} moved in {self.line_bytes}-byte granules "
                  f"(coalescing {percent_text(self.coalescing)}), "
                  f"{bytes_text(self.distinct_bytes)} distinct")
        work = [[f.name, count_text(getattr(self.ops, f.name))] for f in fields(LaneOps)]
        work += [[f"simd.{f.name}", count_text(getattr(self.simd, f.name))]
                 for f in fields(SimdOps)]
        work += [["threadgroup barriers", count_text(self.threadgroup_barriers)]]
        other = [["threadgroup accesses (wavefronts)", count_text(self.threadgroup_accesses)],
                 ["bank conflicts (extra wavefronts)", count_text(self.bank_conflicts)],
                 ["threadgroup atomics", count_text(self.threadgroup_atomics)],
                 ["SIMD efficiency", percent_text(self.simd_efficiency)],
                 ["ILP (issues / dependent issues)",
                  f"{self.ilp:.2f}" if self.dependent_issues else "not measured"],
                 ["loads in flight (loads / dependent loads)",
                  "not measured" if self.loads_in_flight is None
                  else f"{self.loads_in_flight:.2f}"],
                 ["divergence sites", ", ".join(f"line {s.place} ({s.divergences}×)"
                                                for s in self.divergence_sites) or "none"]]
        lines = [[s.place, bytes_text(s.device_bytes), count_text(s.transactions),
                  count_text(s.threadgroup_accesses), count_text(s.bank_conflicts),
                  count_text(s.lane_ops), count_text(s.divergences)]
                 for s in self.source_lines]
        return [
            (memory, ["buffer", "loaded", "stored", "accesses", "transactions",
                      "distinct lines", "atomics", "coalescing"], buffer_rows),
            ("work", ["class", "count"], [r for r in work if r[1] != "0"]),
            ("threadgroup memory and SIMD", ["", "value"], other),
            ("per source line", ["line", "device bytes", "transactions", "tg accesses",
                                 "bank conflicts", "lane ops", "divergences"], lines),
        ]

    def __str__(self) -> str:
        out = [f"Counters {self.summary()}"]
        for title, header, rows in self.sections():
            out.append(title)
            if rows:
                out += text_table(header, rows, indent="  ", numeric=True)
        return "\n".join(out)

    def _repr_html_(self) -> str:
        parts = [f"<div><div><b>Counters</b> {html.escape(self.summary())}</div>"]
        parts += [html_table(caption=title, header=header, rows=rows, numeric=True)
                  for title, header, rows in self.sections() if rows]
        return "".join(parts) + "</div>"

    def plot(self) -> go.Figure:
        """Bars of bytes (requested, moved, distinct) and operations by class."""
        from .figures import counters_figure

        return counters_figure([self])

    def plot_lines(self) -> go.Figure:
        """Per source line: bytes, transactions, threadgroup accesses and conflicts."""
        from .figures import lines_figure

        return lines_figure(self)


Flat = TypeVar("Flat", "LaneOps", "SimdOps")


def _ratio(a: float, b: float) -> float:
    return a / b if b else 1.0


def _counts(c: Counters) -> Iterator[tuple[str, str, object]]:
    for f in fields(Counters):
        if f.type == "int":
            yield "Counters", f.name, getattr(c, f.name)
    for group in (c.ops, c.simd, *c.buffers, *c.source_lines):
        for f in fields(group):
            if f.type == "int":
                yield type(group).__name__, f.name, getattr(group, f.name)


def _check_count(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}({name}=...) must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{owner}({name}=...) must be >= 0, got {value}")


def _add_flat(a: Flat, b: Flat) -> Flat:
    return type(a)(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a)})
