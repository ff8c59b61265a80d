"""Apple GPUs, M1 to M5: what each chip has, and where each number comes from.

Every field of a `Chip` carries a `Source` (a document and what it says; estimates are
marked). Peak rates are not stored: they are derived from cores × lanes × 2 × clock (an FMA
is two operations) and say so. The numbers themselves live in `chip_table.py`.

Variants: a chip sold with several GPU-core counts is one entry per count. The plain name
("M2 Max") is the full configuration (38 cores); a binned one is asked for with the core
count, in the name ("M2 Max 30-core", "m2max30") or as `gpu("M2 Max", cores=30)`.

The default GPU (`MTWORK_GPU` unset) is the 32-core M1 Max: philipturner/metal-benchmarks
measured the instruction throughputs, occupancy behaviour and caches the model is built on
on that chip, so it is the entry with the fewest estimates.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields

ENV_VAR = "MTWORK_GPU"
DEFAULT_GPU = "M1 Max"


@dataclass(frozen=True)
class Source:
    """Where a number comes from: a document (URL or name) and what it says there."""

    document: str
    says: str
    estimate: bool = False

    def __str__(self) -> str:
        mark = " [estimate]" if self.estimate else ""
        return f"{self.document}: {self.says}{mark}"


@dataclass(frozen=True)
class Chip:
    """One Apple GPU configuration. Sizes in bytes, clock in GHz, bandwidth in GB/s."""

    name: str
    gpu_cores: int
    family: str
    clock_ghz: float
    memory_bandwidth_gbs: float
    l2_cache_bytes: int | None
    slc_bytes: int
    memory_latency_ns: float
    l2_latency_ns: float
    alus_per_core: int
    simd_width: int
    schedulers_per_core: int
    max_threads_per_threadgroup: int
    max_threads_per_core: int
    threadgroup_memory_per_threadgroup: int
    threadgroup_memory_per_core: int
    register_file_per_core: int
    max_registers_per_thread: int
    l1_cache_bytes: int
    line_bytes: int
    threadgroup_banks: int
    bank_bytes: int
    l1_bytes_per_core_cycle: int
    matrix_ffma_per_core_cycle_f32: float
    matrix_ffma_per_core_cycle_f16: float
    bf16_arithmetic: str
    sources: tuple[tuple[str, Source], ...]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.gpu_cores}-core GPU)"

    def source(self, field_name: str) -> Source:
        """The source of one field (or of a derived rate: how it is derived)."""
        if field_name in DERIVED:
            return DERIVED[field_name]
        for name, source in self.sources:
            if name == field_name:
                return source
        raise KeyError(f"{self.label} has no field `{field_name}`; fields: {fact_names()}")

    @property
    def fp32_tflops(self) -> float:
        """Peak FP32: cores × ALUs × 2 (FMA) × clock."""
        return self.gpu_cores * self.alus_per_core * 2 * self.clock_ghz / 1000

    @property
    def fp16_tflops(self) -> float:
        """Peak FP16: the FP32 rate (256 F16 and 256 F32 FMA operations per core-cycle on
        Apple7 and later, metal-benchmarks)."""
        return self.fp32_tflops

    @property
    def bf16_tflops(self) -> float:
        """bfloat16 arithmetic is emulated in FP32 (see `bf16_arithmetic`): one FP32 op plus
        one conversion each, so half the FP32 rate."""
        return self.fp32_tflops / 2

    @property
    def matrix_tflops_f32(self) -> float:
        """`simdgroup_float8x8` peak: cores × measured FFMA per core-cycle × 2 × clock."""
        return self.gpu_cores * self.matrix_ffma_per_core_cycle_f32 * 2 * self.clock_ghz / 1000

    @property
    def matrix_tflops_f16(self) -> float:
        """`simdgroup_half8x8` peak: cores × measured FFMA per core-cycle × 2 × clock."""
        return self.gpu_cores * self.matrix_ffma_per_core_cycle_f16 * 2 * self.clock_ghz / 1000

    def __str__(self) -> str:
        return (f"{self.label}: {self.family}, {self.clock_ghz:.3f} GHz, "
                f"{self.fp32_tflops:.1f} TFLOPS FP32, {self.memory_bandwidth_gbs:g} GB/s")


_DERIVATION = "derived in mtwork.gpu.chips"
DERIVED = {
    "fp32_tflops": Source(_DERIVATION, "gpu_cores × alus_per_core × 2 × clock_ghz"),
    "fp16_tflops": Source(_DERIVATION, "= fp32_tflops (metal-benchmarks: F16 and F32 FMA "
                                       "both 256 ops per core-cycle on M1, A15 and later)"),
    "bf16_tflops": Source(_DERIVATION, "fp32_tflops / 2: emulated bfloat, one FP32 op and "
                                       "one conversion per operation", estimate=True),
    "matrix_tflops_f32": Source(_DERIVATION,
                                "gpu_cores × matrix_ffma_per_core_cycle_f32 × 2 × clock_ghz"),
    "matrix_tflops_f16": Source(_DERIVATION,
                                "gpu_cores × matrix_ffma_per_core_cycle_f16 × 2 × clock_ghz"),
}


def fact_names() -> tuple[str, ...]:
    """The fields of `Chip` that hold facts (each must have a source)."""
    return tuple(f.name for f in fields(Chip) if f.name not in ("name", "sources"))


def chips() -> tuple[Chip, ...]:
    """Every known configuration, in table order."""
    from .chip_table import CHIPS

    return CHIPS


def chip_names() -> tuple[str, ...]:
    """The known chip names with their GPU-core counts, e.g. "M2 Max (30 or 38 cores)"."""
    counts: dict[str, list[int]] = {}
    for chip in chips():
        counts.setdefault(chip.name, []).append(chip.gpu_cores)
    return tuple(f"{name} ({' or '.join(str(c) for c in sorted(cores))} cores)"
                 for name, cores in counts.items())


_CORES_SUFFIX = re.compile(r"^(?P<cores>\d+)?(?:c|core|cores|coregpu|gpu)?$")


def gpu(name: str, cores: int | None = None) -> Chip:
    """The chip called `name`: "M2 Max", "m2max", "M2-Max" all work; a binned variant by
    its core count, in the name ("M2 Max 30-core") or as `cores`. Without a count, the
    full configuration."""
    if not isinstance(name, str):
        raise TypeError(f"gpu(name=...) must be a string like 'M2 Max', got {name!r}")
    wanted_key = _key(name)
    # The longest known name the key starts with ("m2max" before "m2"), then a core count.
    for chip_key in sorted({_key(c.name) for c in chips()}, key=len, reverse=True):
        suffix = _CORES_SUFFIX.match(wanted_key[len(chip_key):])
        if wanted_key.startswith(chip_key) and suffix:
            break
    else:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(chip_names())}")
    known = [c for c in chips() if _key(c.name) == chip_key]
    in_name = int(suffix["cores"]) if suffix["cores"] else None
    if cores is not None and in_name is not None and cores != in_name:
        raise ValueError(f"gpu({name!r}, cores={cores}): the name says {in_name} cores")
    wanted = cores if cores is not None else in_name
    if wanted is None:
        return max(known, key=lambda c: c.gpu_cores)
    for chip in known:
        if chip.gpu_cores == wanted:
            return chip
    offered = " or ".join(str(c.gpu_cores) for c in known)
    raise ValueError(f"{known[0].name} comes with {offered} GPU cores, not {wanted}")


def default_gpu() -> Chip:
    """The chip named by `MTWORK_GPU`, else the 32-core M1 Max (the best-measured entry)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return gpu(DEFAULT_GPU)
    try:
        return gpu(value)
    except ValueError as error:
        raise ValueError(f"{ENV_VAR}={value!r} is not a known GPU: {error}") from None


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())
