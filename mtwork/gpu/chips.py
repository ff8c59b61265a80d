"""Apple GPUs: what a chip has (`Chip`), and where each number comes from (`Source`).

Every field of a `Chip` carries a `Source` (a document and what it says; estimates are
marked). Peak rates are not stored: they are derived from cores × lanes × 2 × clock (an FMA
is two operations) and say so. The numbers themselves live in `chip_table.py`; finding a
chip by name is `catalog.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
    registers_per_core: int
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
