"""Modelled time of a dispatch on an Apple GPU, from its `Counters` and a `Chip`.

A roofline with occupancy. Each term is the time one resource needs for the dispatch's
work; the slowest names the bound, and the total is that plus the launch overhead:

* memory (DRAM): distinct bytes / bandwidth. A line reaches DRAM once; touching it again
  is assumed to hit a cache (the reuse estimate: optimistic for a kernel that sweeps more
  than the system level cache holds twice).
* cache (L1): every SIMD-group access goes through its core's L1, which moves 64 B per
  core-cycle: each `line_bytes` granule an access touches (64-byte segments on `sim`)
  costs `line_bytes / 64` cycles, hit or miss, so uncoalesced access costs even when its
  lines are cached. The slower of the two names the bound: "memory" or "cache".
* ALU: SIMD-group instructions × issue cycles per class (metal-benchmarks) on 4 schedulers
  per core. matrix: 8x8x8 `simdgroup_matrix` multiply-accumulates at the measured FFMA
  rate. Both run on the same FP32 pipelines, so they add.
* threadgroup memory: wavefronts (bank conflicts serialise as extra ones) at one per
  core-cycle.
* latency: each SIMD-group waits for its device loads, as many at a time as its code
  issues before it needs one (`Counters.loads_in_flight`, measured from the compiled
  code; `Assumptions.loads_in_flight` when not measured), at DRAM latency for first
  touches and L2 latency for the rest, hidden only by the other SIMD-groups resident on
  the core, and no more loads than the bytes a core keeps in flight allow (Little's
  law at the chip's bandwidth and DRAM latency, times `Assumptions.memory_parallelism`,
  fitted); plus the exposed latency of threadgroup barriers.
* launch: a fixed cost per dispatch.

Occupancy (threadgroups resident per core) is limited by threads, threadgroup memory and
registers per core; ALU issue slows down below 24 resident SIMD-groups (a SIMD-group
issues a dependent instruction every ~6 cycles), `simdgroup_matrix` issue below 8 (two
multiply-accumulates of ~36 cycles' latency in flight per scheduler). ALU issue needs
fewer of them when the kernel's threads keep independent chains (`Counters.ilp`).
Per-core terms use the busiest core's share of the threadgroups, so a partial last wave
counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..display import bytes_text, count_text, html_table, percent_text, seconds_text, text_table
from .catalog import default_gpu, gpu
from .chips import Chip
from .counters import SIMD_WIDTH, Counters

if TYPE_CHECKING:
    import plotly.graph_objects as go

BOUNDS = ("memory", "cache", "ALU", "matrix", "threadgroup memory", "latency", "launch")

# Issue cycles of one SIMD-group instruction on one scheduler: metal-benchmarks
# "Instruction Throughputs" (second figure = M1 Max), except where marked.
LANE_OP_CYCLES: dict[str, float] = {
    "f32": 1.0,  # FADD32, FMUL32, FFMA32: "2, 1"
    "f16": 1.0,  # FADD16, FMUL16, FFMA16: "1, 1"
    "bf16": 2.0,  # assumption: an FP32 op plus a conversion (bfloat is emulated)
    "integer": 1.0,  # IADD32 "1, 1"; BITWISE32 1.06; ICMPSEL32 "1, 1"
    "integer_mul": 4.0,  # IMUL32, IMAD32 "4, 4"; LSHIFT32 4.01
    "exp_log": 4.0,  # EXP2_32, LOG2_32 4.00; EXPE_32, LOGE_32 4.00
    "recip_div": 6.0,  # RECIP32 6; DIV32 6.01
    "sqrt_rsqrt": 8.0,  # RSQRT32 "8, 8"; SQRT32 8
    "trig": 14.28,  # SIN32, COS32 14.28
    "convert": 4.0,  # CONVERT(F->I32) 4; RINT32 4
    "convert_float": 1.0,  # assumption: 16-bit operands cost "zero additional cost"; a move
}
SIMD_OP_CYCLES = {"shuffles": 2.04, "reductions": 14.54}  # BROADCAST32 2.04; SUM<F32> 14.54
FFMA_PER_MMA = 8 * 8 * 8
# metal-benchmarks: "ALU utilization maxes out at 24 simds/core"; its FFMA32 table gives
# 11.34 cycles per instruction at 4 SIMD-groups, 5.71 at 8 and 1.99 at 88 (ILP 1).
SIMDGROUPS_FOR_FULL_ISSUE = 24
# simdgroup_matrix: metal-benchmarks' "Intra-simd communication" table (M1 Max) gives
# MATMUL<8x8xF32> a throughput of ~18 cycles and an adjusted latency of ~36 (F16: ~17 and
# ~34): by Little's law two multiply-accumulates in flight per scheduler, eight per core of
# four schedulers, keep the matrix pipelines full. A SIMD-group's multiply-accumulates
# into one accumulator form a chain, so eight SIMD-groups per core reach the full rate
# whatever their code (kernels with several accumulators need fewer; not credited).
SIMDGROUPS_FOR_FULL_MATRIX = 8
# With ILP k a SIMD-group counts as ILP_GAIN[k] SIMD-groups of ILP 1 towards the 24. Fitted
# to the same FFMA32 table (M1 Max) at ILP 1-4: the slowdown at 4 and 8 SIMD-groups per
# core against 88 at the same ILP is 5.70, 2.87 (ILP 1); 4.47, 2.27 (2); 3.30, 2.04 (3);
# 2.70, 1.57 (4); the gain is the geometric mean over 4 and 8 of ILP 1's slowdown over
# ILP k's. Between whole ILPs it is interpolated; above 4 (the table's last) it stays.
ILP_GAIN = (1.0, 1.27, 1.56, 1.97)


@dataclass(frozen=True)
class Assumptions:
    """Constants no public measurement pins down. Vary them to see what depends on them."""

    loads_in_flight: int = 4  # device loads a SIMD-group issues before it waits on one,
    # for counters without the measure (Counters.loads_in_flight)
    barrier_cycles: float = 32.0  # exposed cost of one threadgroup barrier
    wavefronts_per_core_cycle: float = 1.0  # threadgroup memory: 32 banks × 4 B per cycle
    # ferrox (github.com/antonellof/ferrox) issue #149: an extra tiny dispatch cost 5.16 µs
    # of GPU time on an M2 Pro; an upper bound, as it includes that kernel's own work.
    launch_seconds: float = 5e-6
    # The same issue: the 832 dispatches cost 0.50 ms of host (CPU) time, 0.61 µs each,
    # encoded into one command buffer (`mtwork.gpu.sequence`).
    host_seconds_per_dispatch: float = 0.61e-6
    # A call that waits for its result pays a command buffer's round trip once:
    # "There is immense overhead to encode kernels on the CPU in separate encoders or
    # command buffers. This latency (~10 microseconds)" (philipturner/metal-flash-attention
    # issue #18).
    sync_seconds: float = 10e-6
    # Bytes one core's loads keep in flight at most, in multiples of its share of Little's
    # law at full bandwidth (its share of DRAM bandwidth times DRAM latency: M1 Max, 400
    # GB/s over 32 cores at 311 ns, Chips and Cheese, is 3.9 KB). At least 1, or a
    # streaming copy could not reach the bandwidth it is measured at; the value is fitted
    # on the validation set's fit part (tests/validation/fit.py).
    memory_parallelism: float = 3.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"Assumptions({f.name}=...) must be > 0, "
                                 f"got {getattr(self, f.name)!r}")


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Occupancy:
    threadgroups_per_core: int
    simdgroups_per_core: int
    limited_by: str  # "threads", "threadgroup memory", "registers" or "grid"
    issue_efficiency: float  # min(1, SIMD-groups per core / 8): matrix issue
    simd_efficiency: float  # active lanes / 32
    ilp: float  # Counters.ilp
    alu_issue_efficiency: float  # min(1, SIMD-groups × ilp_gain(ilp) / 24)
    loads_in_flight: float  # per SIMD-group: Counters.loads_in_flight, else the assumption
    loads_measured: bool  # whether loads_in_flight is the counters' measure
    registers: int = 0  # per thread, as occupancy takes them (`registers_used`); 0 unknown


@dataclass(frozen=True)
class Estimate:
    """The modelled time of a dispatch: total, every term, and the bound."""

    kernel: str
    chip: str
    seconds: float
    bound: str
    limiting_term: str  # the term that set the time, e.g. "cache (L1)"
    terms: tuple[Term, ...]
    occupancy: Occupancy
    assumptions: Assumptions = field(default_factory=Assumptions)

    def term(self, name: str) -> Term:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(f"no term {name!r}; terms: {', '.join(t.name for t in self.terms)}")

    def summary(self) -> str:
        return (f"`{self.kernel}` on {self.chip}: {seconds_text(self.seconds)} modelled, "
                f"{self.bound}-bound (limited by {self.limiting_term})")

    def _occupancy_text(self) -> str:
        o = self.occupancy
        return (f"occupancy: {o.threadgroups_per_core} threadgroup(s), "
                f"{o.simdgroups_per_core} SIMD-groups per core, limited by {o.limited_by}"
                f"{f' ({o.registers} registers a thread)' if o.registers else ''}; "
                f"issue efficiency {percent_text(o.alu_issue_efficiency)} ALU at ILP "
                f"{o.ilp:.2f}, {percent_text(o.issue_efficiency)} matrix; "
                f"SIMD efficiency {percent_text(o.simd_efficiency)}; {o.loads_in_flight:.3g} "
                f"loads in flight ({'measured' if o.loads_measured else 'assumed'})")

    def _rows(self) -> list[list[str]]:
        return [[t.name, seconds_text(t.seconds), t.detail] for t in self.terms]

    def __str__(self) -> str:
        return "\n".join([f"Estimate {self.summary()}",
                          *text_table(["term", "time", "from"], self._rows(), indent="  "),
                          "  " + self._occupancy_text(),
                          "  ALU and matrix share the FP32 pipelines: they add."])

    def _repr_html_(self) -> str:
        return html_table(caption=f"Estimate {self.summary()}", header=["term", "time", "from"],
                          rows=self._rows(), note=self._occupancy_text()
                          + "; ALU and matrix share the FP32 pipelines: they add.")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["terms"] = list(out["terms"])
        return out

    def plot(self) -> go.Figure:
        from .figures import estimates_figure

        return estimates_figure([self])


def estimate(counters: Counters, chip: Chip | str | None = None,
             assumptions: Assumptions | None = None) -> Estimate:
    """The modelled time of `counters` on `chip` (a `Chip`, a name for `gpu()`, or None
    for `default_gpu()`)."""
    if not isinstance(counters, Counters):
        raise TypeError(f"estimate(counters=...) takes a Counters, got {counters!r}")
    chip = default_gpu() if chip is None else gpu(chip) if isinstance(chip, str) else chip
    if not isinstance(chip, Chip):
        raise TypeError(f"estimate(chip=...) takes a Chip, a name or None, got {chip!r}")
    a = assumptions or Assumptions()
    occ = occupancy(counters, chip, a)
    hz = chip.clock_ghz * 1e9
    per_dispatch = math.ceil(counters.threadgroups / counters.dispatches)
    share = math.ceil(per_dispatch / chip.gpu_cores) / per_dispatch  # busiest core's share
    eff = occ.issue_efficiency

    alu_cycles = sum(getattr(counters.ops, name) * cycles
                     for name, cycles in LANE_OP_CYCLES.items()) / (
        SIMD_WIDTH * occ.simd_efficiency)
    alu_cycles += sum(getattr(counters.simd, n) * c for n, c in SIMD_OP_CYCLES.items())
    alu = alu_cycles * share / (chip.schedulers_per_core * hz * occ.alu_issue_efficiency)
    s = counters.simd
    mma_ffma = FFMA_PER_MMA * (s.mma_f32 / chip.matrix_ffma_per_core_cycle_f32
                               + (s.mma_f16 + s.mma_bf16) / chip.matrix_ffma_per_core_cycle_f16)
    matrix = mma_ffma * share / (hz * eff)

    dram_bytes = counters.distinct_bytes
    dram = dram_bytes / (chip.memory_bandwidth_gbs * 1e9)
    l1_bytes = counters.moved_bytes + counters.device_atomics * counters.line_bytes
    cache = l1_bytes * share / (chip.l1_bytes_per_core_cycle * hz)
    wavefronts = (counters.threadgroup_accesses + counters.bank_conflicts
                  + counters.threadgroup_atomics)
    tg = wavefronts * share / (a.wavefronts_per_core_cycle * hz)

    load_latency = _load_latency_ns(counters, chip) * 1e-9
    in_flight = min(occ.simdgroups_per_core * occ.loads_in_flight,
                    _core_loads_in_flight(counters, chip, a))
    memory_wait = counters.device_loads * share / in_flight * load_latency
    barrier_wait = (counters.threadgroup_barriers * share / occ.threadgroups_per_core
                    * a.barrier_cycles / hz)
    launch = counters.dispatches * a.launch_seconds

    terms = (
        Term("memory (DRAM)", dram, f"{bytes_text(dram_bytes)} at "
                                    f"{chip.memory_bandwidth_gbs:g} GB/s"),
        Term("cache (L1)", cache,
             f"{bytes_text(l1_bytes)} in {counters.line_bytes}-B granules, "
             f"{chip.l1_bytes_per_core_cycle} B/cycle per core"),
        Term("ALU", alu, f"{count_text(round(alu_cycles))} issue cycles"),
        Term("matrix", matrix, f"{count_text(s.mma_f32 + s.mma_f16 + s.mma_bf16)} "
                               "8x8x8 multiply-accumulates"),
        Term("threadgroup memory", tg, f"{count_text(wavefronts)} wavefronts "
                                       f"({count_text(counters.bank_conflicts)} from "
                                       "bank conflicts)"),
        Term("latency", memory_wait + barrier_wait,
             f"loads {seconds_text(memory_wait)} ({seconds_text(load_latency)} each, "
             f"{occ.loads_in_flight:.3g} in flight per SIMD-group, "
             f"{'measured' if occ.loads_measured else 'assumed'}; {in_flight:.3g} per "
             f"core), barriers "
             f"{seconds_text(barrier_wait)}"),
        Term("launch", launch, f"{counters.dispatches} × {seconds_text(a.launch_seconds)}"),
    )
    # (bound, limiting term, time) of each resource; ALU and matrix add (same pipelines).
    compute = ("matrix", "matrix") if matrix > alu else ("ALU", "ALU")
    body = [("memory", "memory (DRAM)", dram), ("cache", "cache (L1)", cache),
            (*compute, alu + matrix),
            ("threadgroup memory", "threadgroup memory", tg),
            ("latency", "latency", memory_wait + barrier_wait)]
    bound, limit, slowest = max(body, key=lambda b: b[2])
    if launch >= slowest:
        bound, limit = "launch", "launch"
    return Estimate(counters.kernel, chip.label, launch + slowest, bound, limit, terms, occ,
                    a)


def occupancy(counters: Counters, chip: Chip,
              assumptions: Assumptions | None = None) -> Occupancy:
    """Threadgroups and SIMD-groups resident per core, what limits them, and how much
    each SIMD-group has in flight (independent instructions, loads)."""
    _check_fits(counters, chip)
    simds = counters.simdgroups_per_threadgroup
    lanes = simds * SIMD_WIDTH
    limits = {"threads": chip.max_threads_per_core // lanes}
    if counters.threadgroup_memory:
        limits["threadgroup memory"] = (chip.threadgroup_memory_per_core
                                        // counters.threadgroup_memory)
    registers = registers_used(counters, chip)
    if registers:
        # The SIMD-groups a core keeps are set by all of their registers together
        # (`registers_per_core`), in whole threadgroups.
        limits["registers"] = chip.registers_per_core // (SIMD_WIDTH * registers) // simds
    per_dispatch = math.ceil(counters.threadgroups / counters.dispatches)
    limits["grid"] = math.ceil(per_dispatch / chip.gpu_cores)
    limited_by = min(limits, key=lambda k: limits[k])
    resident = limits[limited_by]
    simdgroups = resident * simds
    measured = counters.loads_in_flight
    return Occupancy(resident, simdgroups, limited_by,
                     min(1.0, simdgroups / SIMDGROUPS_FOR_FULL_MATRIX),
                     counters.simd_efficiency,
                     counters.ilp,
                     min(1.0, simdgroups * ilp_gain(counters.ilp) / SIMDGROUPS_FOR_FULL_ISSUE),
                     measured or (assumptions or Assumptions()).loads_in_flight,
                     measured is not None, registers)


def registers_used(counters: Counters, chip: Chip) -> int:
    """The registers a thread of the dispatch is taken to hold: the counters' estimate,
    at most what a thread can have (128) and what lets a whole threadgroup be resident
    (the register file over its threads). Metal runs any threadgroup its pipeline allows,
    so a larger estimate means Apple's compiler allocated fewer (or spilled), not that
    the dispatch fails; 0: unknown."""
    lanes = counters.simdgroups_per_threadgroup * SIMD_WIDTH
    fits = chip.register_file_per_core // (lanes * 4)
    return min(counters.registers, chip.max_registers_per_thread, fits)


def ilp_gain(ilp: float) -> float:
    """How many ILP-1 SIMD-groups one SIMD-group of this ILP stands for (`ILP_GAIN`)."""
    k = min(max(ilp, 1.0), float(len(ILP_GAIN)))
    low = int(k)
    if low == len(ILP_GAIN):
        return ILP_GAIN[-1]
    return ILP_GAIN[low - 1] + (k - low) * (ILP_GAIN[low] - ILP_GAIN[low - 1])


def _check_fits(c: Counters, chip: Chip) -> None:
    """The dispatch must be one Metal could launch on `chip`. The register count is an
    estimate, never a reason to refuse: Metal runs what its compiler fits
    (`registers_used`)."""
    if c.threads_per_threadgroup > chip.max_threads_per_threadgroup:
        raise ValueError(f"`{c.kernel}`: threads_per_threadgroup={c.threads_per_threadgroup} "
                         f"exceeds {chip.max_threads_per_threadgroup} on {chip.label}")
    if c.threadgroup_memory > chip.threadgroup_memory_per_threadgroup:
        raise ValueError(f"`{c.kernel}`: threadgroup_memory={c.threadgroup_memory} bytes "
                         f"exceeds {chip.threadgroup_memory_per_threadgroup} on {chip.label}")
    if chip.line_bytes % c.line_bytes or c.line_bytes % chip.l1_bytes_per_core_cycle:
        raise ValueError(f"`{c.kernel}`: counted in {c.line_bytes}-byte granules; "
                         f"{chip.label} needs its {chip.line_bytes}-byte lines or a part of "
                         f"one that is a multiple of its L1's "
                         f"{chip.l1_bytes_per_core_cycle} B per cycle")


def _core_loads_in_flight(c: Counters, chip: Chip, a: Assumptions) -> float:
    """The SIMD-group loads one core keeps in flight at most: its share (among the cores
    with work) of bandwidth × DRAM latency (Little's law) × `memory_parallelism`, over
    the bytes a load moves (stores are not waited for)."""
    loads = sum(b.loads for b in c.buffers)
    if not loads:
        return math.inf
    # a buffer's transactions split between its loads and stores by their counts
    per_access = sum(b.transactions * b.loads / (b.loads + b.stores)
                     for b in c.buffers if b.loads) * c.line_bytes / loads
    busy = min(chip.gpu_cores, math.ceil(c.threadgroups / c.dispatches))  # cores with work
    in_flight = (chip.memory_bandwidth_gbs / busy * chip.memory_latency_ns
                 * a.memory_parallelism)  # GB/s × ns = bytes
    return max(1.0, in_flight / per_access)


def _load_latency_ns(c: Counters, chip: Chip) -> float:
    """DRAM latency for first touches of a line, L2 latency for the rest."""
    transactions = sum(b.transactions for b in c.buffers)
    if not transactions:
        return chip.memory_latency_ns
    first = sum(b.distinct_lines for b in c.buffers) / transactions
    return first * chip.memory_latency_ns + (1 - first) * chip.l2_latency_ns

