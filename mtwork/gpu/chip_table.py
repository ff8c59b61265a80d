"""The numbers behind `mtwork.gpu.chips`, each with its source.

Sources, in order of preference: Apple (press releases, product tech specs, the Metal
feature set tables), philipturner/metal-benchmarks (README at commit dc2adc6, 2024-09-22:
microarchitecture measured on M1 Max and M2), Alyssa Rosenzweig's M1 GPU reverse
engineering, Chips and Cheese; clocks of M3 and later from measurements or spec aggregators
(marked estimates). Microarchitecture measured on Apple7/8 (M1, M2) is assumed unchanged
on M3, M4 and M5 and marked as an estimate there: Apple9 added Dynamic Caching, which
allocates registers and threadgroup memory from one on-chip cache, and nobody has published
its limits.

Not included: M5 Ultra (no published configuration in the sources read) and the A-series
(Apple publishes neither GPU clocks nor memory bandwidth for them).
"""

from __future__ import annotations

from .chips import Chip, Source

KIB = 1024
MIB = 1024 * 1024

MB = "philipturner/metal-benchmarks README (github.com/philipturner/metal-benchmarks)"
FEATURE_TABLES = "Apple, Metal feature set tables (developer.apple.com/metal/limits)"
ROSENZWEIG = ("Alyssa Rosenzweig, 'Dissecting the Apple M1 GPU, part III' "
              "(rosenzweig.io/blog/asahi-gpu-part-3.html), as summarised at "
              "realworldtech.com/forum/?threadid=201676")
CHIPS_AND_CHEESE = ("Chips and Cheese, 'iGPU Cache Setups Compared, Including M1' "
                    "(chipsandcheese.com/2022/05/21), figures as tabulated in "
                    "github.com/azhirnov/cpu-gpu-arch gpu/Apple-M1.md")
VKFFT_OCCUPANCY = ("Philip Turner's table of 32-bit registers against occupancy on the M1 "
                   "GPU (github.com/DTolm/VkFFT issue #91, comment of 2023-01-10)")
BANKS = ("standard 32-bank model; gpu-forge research notes (github.com/kavanaghpatrick/"
         "gpu-forge, skills/msl-kernels/references/all-findings.md, findings 722-723) cite a "
         "microbenchmark study ('The mystery of Apple M3 on-chip shared memory') finding M1 "
         "'a classical shared memory with 32 independent banks' and M3 irregular; "
         "metal-benchmarks lists Apple's bank size and count as TBD; MLX pads threadgroup "
         "tiles by 16 bytes (steel/gemm/gemm.h tgp_padding)")

# Microarchitecture: (value, what the source says, source). Measured on M1/M2.
_MICRO: dict[str, tuple[object, str, str]] = {
    "alus_per_core": (128, "'Apple described each GPU core as having 128 ALUs'", MB),
    "simd_width": (32, "'four schedulers, each dispatching one instruction from one simd "
                       "(32 threads) per cycle'", MB),
    "schedulers_per_core": (4, "'The Apple GPU core has four schedulers'", MB),
    "max_threads_per_threadgroup": (1024, "maximum threads per threadgroup: 1024",
                                    FEATURE_TABLES),
    "max_threads_per_core": (3072, "On-Chip Memory table, Apple 7, 8: 'Max Threads "
                                   "384-3072' per core", MB),
    "threadgroup_memory_per_threadgroup": (32 * KIB, "maximum total threadgroup memory "
                                                     "allocation: 32 KB", FEATURE_TABLES),
    "threadgroup_memory_per_core": (60 * KIB, "On-Chip Memory table, Apple 7, 8: 'Shared "
                                              "Memory ~60 KB' per core", MB),
    "register_file_per_core": (208 * KIB, "On-Chip Memory table, Apple 7, 8: 'Register "
                                          "File ~208 KB' per core; what one threadgroup's "
                                          "threads can hold (128 registers × 384 threads "
                                          "is 192 KiB)", MB),
    "registers_per_core": (3072 * 32, "occupancy by registers, 13 rows from 32 registers "
                                      "(96 SIMD-groups a core) to 128 (24): SIMD-groups "
                                      "resident are at most 98,304 / (32 × registers), "
                                      "rounded down to whole threadgroups", VKFFT_OCCUPANCY),
    "max_registers_per_thread": (128, "each thread can use up to 128 32-bit registers; "
                                      "more registers, fewer threads in flight",
                                 ROSENZWEIG),
    "l1_cache_bytes": (8 * KIB, "On-Chip Memory table: 'Data Cache 8 KB' per core", MB),
    "line_bytes": (128, "On-Chip Memory table: 'Global Cache Line 128 B'", MB),
    "threadgroup_banks": (32, "32 banks", BANKS),
    "bank_bytes": (4, "4-byte banks", BANKS),
    "l1_bytes_per_core_cycle": (64, "'On-Core Data BW/Cycle 64 B'", MB),
    "matrix_ffma_per_core_cycle_f32": (101.7, "Operations per Second: 'Matrix FFMA32' "
                                              "101.7 per core-cycle (A15+, M1+)", MB),
    "matrix_ffma_per_core_cycle_f16": (102.5, "Operations per Second: 'Matrix FFMA16' "
                                              "102.5 per core-cycle (A15+, M1+)", MB),
    "bf16_arithmetic": ("emulated in FP32",
                        "MLX computes bfloat math in float and casts back (mlx/backend/"
                        "metal/kernels/bf16_math.h); llama.cpp PR #10171: 'bfloat "
                        "performance is not great on Metal yet'; no native rate published",
                        "MLX and ggml-org/llama.cpp"),
    "memory_latency_ns": (311.0, "M1 GPU, RAM latency 311 ns", CHIPS_AND_CHEESE),
    "l2_latency_ns": (76.3, "M1 GPU, L2 latency 76.3 ns", CHIPS_AND_CHEESE),
}
# Published as approximate ("~") or not measured at all: estimates on every chip.
_ALWAYS_ESTIMATED = {"threadgroup_memory_per_core", "register_file_per_core",
                     "threadgroup_banks", "bank_bytes", "bf16_arithmetic"}
_MEASURED_ON_M1_ONLY = {"memory_latency_ns", "l2_latency_ns", "registers_per_core"}


def _micro(family: str, chip_name: str) -> dict[str, tuple[object, Source]]:
    measured_here = family in ("Apple7", "Apple8")
    out = {}
    for name, (value, says, document) in _MICRO.items():
        estimate = name in _ALWAYS_ESTIMATED or not measured_here or (
            name in _MEASURED_ON_M1_ONLY and not chip_name.startswith("M1"))
        if estimate and not measured_here:
            says += "; measured on M1/M2, assumed unchanged on this chip"
        elif estimate and name in _MEASURED_ON_M1_ONLY:
            says += "; measured on M1, assumed for this chip"
        out[name] = (value, Source(document, says, estimate))
    return out


def _clock(ghz: float, says: str, document: str = MB,
           estimate: bool = False) -> tuple[float, Source]:
    return ghz, Source(document, f"{says}: {ghz} GHz", estimate)


# Clocks.
M1_CLOCK = _clock(1.278, "GPU table, M1")
M1_BIG_CLOCK = _clock(1.296, "GPU table, M1P/M1M/M1U")
M2_CLOCK = _clock(1.398, "GPU table, M2/M2P/M2M")
M2_ULTRA_CLOCK = _clock(1.398, "GPU table gives M2 Max; M2 Ultra is two M2 Max dies",
                        estimate=True)
M3_CLOCK = _clock(1.398, "spec aggregator lists 1398 MHz for the M3 and M3 Pro GPUs; Apple "
                         "publishes no GPU clock", "hmc-tech.com/gpu", estimate=True)
_M4_MEASURED = ("hoakley, 'M4 Pro full on' (eclecticlight.co, 2025-01-22): the GPU runs 'at "
                "its maximum frequency of 1,578 MHz' (powermetrics, M4 Pro)")
M4_PRO_CLOCK = _clock(1.578, _M4_MEASURED, "The Eclectic Light Company")
M4_CLOCK = _clock(1.578, _M4_MEASURED + "; assumed for this M4 chip",
                  "The Eclectic Light Company", estimate=True)
M5_CLOCK = _clock(1.74, "spec aggregator lists 1740 MHz for the 10-core M5 GPU; Apple "
                        "publishes no GPU clock", "hmc-tech.com/gpu", estimate=True)


# Caches: metal-benchmarks' L2 and L3 (system level cache) columns.
_L2_UNKNOWN = (None, Source(MB, "L2 size not published for this chip"))


def _cache(size: int, column: str, row: str, estimate: bool = False) -> tuple[int, Source]:
    shown = f"{size // MIB} MB" if size % MIB == 0 else f"{size // KIB} KB"
    return size, Source(MB, f"GPU table, {row}: {column} {shown}", estimate)


def _slc_like(size: int, tier: str) -> tuple[int, Source]:
    return size, Source(MB, f"system level cache not published; assumed equal to {tier} "
                            f"({size // MIB} MB)", True)


APPLE_FAMILY = Source(FEATURE_TABLES, "Apple GPU families: Apple7 = M1 family, Apple8 = M2 "
                                      "family, Apple9 = M3 family and M4")
M5_FAMILY = Source("Apple developer documentation, MTLGPUFamily", "apple10 is the family "
                   "after apple9 (A17, M3, M4); M5 assumed to be apple10", True)


def _apple(release: str, says: str, read_at: str = "") -> Source:
    seen = f", as reported by {read_at}" if read_at else ""
    return Source(f"Apple Newsroom press release on {release}{seen}", says)


ARS_M4 = "Ars Technica's M4 comparison tables, goodnewsapodcast.com copy"
ARS_M3U = "Ars Technica's M3 Ultra table, inforeader.com copy"
LOWYAT = "lowyat.net/2026/385170, citing Apple's press release"

M1_PR = "M1 (2020-11-10)"
M1_PRO_MAX = "M1 Pro and M1 Max (2021-10-18)"
M1_ULTRA = "M1 Ultra (2022-03-08)"
M2_PR = "M2 (2022-06-06)"
M2_PRO_MAX = "M2 Pro and M2 Max (2023-01-17)"
M2_ULTRA = "M2 Ultra (2023-06-05)"
M3_PR = "M3, M3 Pro and M3 Max (2023-10-30)"
M3_ULTRA = "M3 Ultra (2025-03-05)"
M4_PR = "M4 (2024-05-07)"
M4_PRO_MAX = "M4 Pro and M4 Max (2024-10-30)"
M5_PR = "M5 (2025-10-15)"
M5_PRO_MAX = "M5 Pro and M5 Max (2026-03-03)"

M1_BANDWIDTH = (68.25, Source(
    "LPDDR4X-4266 on a 128-bit bus; Apple states no M1 bandwidth (its M2 press release puts "
    "M2's 100GB/s at 50 percent more than M1)", "68.25 GB/s", True))


def _variants(name: str, family: str, clock: tuple[float, Source],
              configurations: list[tuple[int, tuple[float, Source], Source]],
              l2: tuple[int | None, Source], slc: tuple[int, Source]) -> tuple[Chip, ...]:
    """One entry per GPU-core count: `configurations` is [(cores, (GB/s, source), source
    of the core count)]."""
    return tuple(_chip(name, cores, family, clock, bandwidth, l2, slc, cores_source)
                 for cores, bandwidth, cores_source in configurations)


def _chip(name: str, cores: int, family: str, clock: tuple[float, Source],
          bandwidth: tuple[float, Source], l2: tuple[int | None, Source],
          slc: tuple[int, Source], cores_source: Source) -> Chip:
    family_source = M5_FAMILY if family == "Apple10" else APPLE_FAMILY
    facts: dict[str, tuple[object, Source]] = {
        "gpu_cores": (cores, cores_source), "family": (family, family_source),
        "clock_ghz": clock, "memory_bandwidth_gbs": bandwidth, "l2_cache_bytes": l2,
        "slc_bytes": slc, **_micro(family, name)}
    values = {key: value for key, (value, _) in facts.items()}
    sources = tuple(sorted((key, source) for key, (_, source) in facts.items()))
    return Chip(name=name, sources=sources, **values)


def _stated(gbs: float, who: str, title: str, read_at: str = "") -> tuple[float, Source]:
    """A bandwidth Apple states (in the document that gives the core count)."""
    return gbs, _apple(title, f"{who}: {gbs:g}GB/s", read_at)


CHIPS: tuple[Chip, ...] = (
    _variants("M1", "Apple7", M1_CLOCK, [
        (7, M1_BANDWIDTH, _apple(M1_PR, "MacBook Air (M1) tech specs: 7-core GPU")),
        (8, M1_BANDWIDTH, _apple(M1_PR, "8-core GPU"))],
        _cache(768 * KIB, "L2", "M1"), _cache(8 * MIB, "L3", "M1"))
    + _variants("M1 Pro", "Apple7", M1_BIG_CLOCK, [
        (14, _stated(200, "M1 Pro", M1_PRO_MAX), _apple(M1_PRO_MAX, "14-core GPU option")),
        (16, _stated(200, "M1 Pro", M1_PRO_MAX), _apple(M1_PRO_MAX, "up to 16-core GPU"))],
        _cache(256 * KIB, "L2", "M1P"), _cache(24 * MIB, "L3", "M1P"))
    + _variants("M1 Max", "Apple7", M1_BIG_CLOCK, [
        (24, _stated(400, "M1 Max", M1_PRO_MAX), _apple(M1_PRO_MAX, "24-core GPU option")),
        (32, _stated(400, "M1 Max", M1_PRO_MAX), _apple(M1_PRO_MAX, "up to 32-core GPU"))],
        _cache(512 * KIB, "L2", "M1M"), _cache(48 * MIB, "L3", "M1M"))
    + _variants("M1 Ultra", "Apple7", M1_BIG_CLOCK, [
        (48, _stated(800, "M1 Ultra", M1_ULTRA), _apple(M1_ULTRA, "48-core GPU option")),
        (64, _stated(800, "M1 Ultra", M1_ULTRA), _apple(M1_ULTRA, "up to 64-core GPU"))],
        _cache(1024 * KIB, "L2", "M1U"), _cache(96 * MIB, "L3", "M1U"))
    + _variants("M2", "Apple8", M2_CLOCK, [
        (8, _stated(100, "M2", M2_PR), _apple(M2_PR, "MacBook Air (M2) tech specs: 8-core "
                                                       "GPU option")),
        (10, _stated(100, "M2", M2_PR), _apple(M2_PR, "10-core GPU"))],
        _cache(1536 * KIB, "L2 ~", "M2", True), _cache(8 * MIB, "L3", "M2"))
    + _variants("M2 Pro", "Apple8", M2_CLOCK, [
        (16, _stated(200, "M2 Pro", M2_PRO_MAX), _apple(M2_PRO_MAX, "16-core GPU option")),
        (19, _stated(200, "M2 Pro", M2_PRO_MAX), _apple(M2_PRO_MAX, "up to 19-core GPU"))],
        _cache(512 * KIB, "L2 ~", "M2P", True), _cache(24 * MIB, "L3", "M2P"))
    + _variants("M2 Max", "Apple8", M2_CLOCK, [
        (30, _stated(400, "M2 Max", M2_PRO_MAX), _apple(M2_PRO_MAX, "30-core GPU option")),
        (38, _stated(400, "M2 Max", M2_PRO_MAX), _apple(M2_PRO_MAX, "up to 38-core GPU"))],
        _cache(1024 * KIB, "L2 ~", "M2M", True), _cache(48 * MIB, "L3", "M2M"))
    + _variants("M2 Ultra", "Apple8", M2_ULTRA_CLOCK, [
        (60, _stated(800, "M2 Ultra", M2_ULTRA), _apple(M2_ULTRA, "60-core GPU option")),
        (76, _stated(800, "M2 Ultra", M2_ULTRA), _apple(M2_ULTRA, "up to 76-core GPU"))],
        _L2_UNKNOWN, _slc_like(96 * MIB, "two M2 Max dies"))
    + _variants("M3", "Apple9", M3_CLOCK, [
        (8, _stated(100, "M3", M3_PR), _apple(M3_PR, "8-core GPU option")),
        (10, _stated(100, "M3", M3_PR), _apple(M3_PR, "10-core GPU"))],
        _L2_UNKNOWN, _slc_like(8 * MIB, "the M2"))
    + _variants("M3 Pro", "Apple9", M3_CLOCK, [
        (14, _stated(150, "M3 Pro", M3_PR), _apple(M3_PR, "14-core GPU option")),
        (18, _stated(150, "M3 Pro", M3_PR), _apple(M3_PR, "up to 18-core GPU"))],
        _L2_UNKNOWN, _slc_like(24 * MIB, "the M2 Pro"))
    + _variants("M3 Max", "Apple9", M3_CLOCK, [
        (30, _stated(300, "MacBook Pro tech specs, M3 Max with 30-core GPU", M3_PR),
         _apple(M3_PR, "30-core GPU option")),
        (40, _stated(400, "M3 Max (up to)", M3_PR), _apple(M3_PR, "up to 40-core GPU"))],
        _L2_UNKNOWN, _slc_like(48 * MIB, "the M2 Max"))
    + _variants("M3 Ultra", "Apple9", M3_CLOCK, [
        (60, _stated(819, "M3 Ultra (low)", M3_ULTRA, ARS_M3U),
         _apple(M3_ULTRA, "M3 Ultra (low): 60 GPU cores", ARS_M3U)),
        (80, _stated(819, "M3 Ultra (high)", M3_ULTRA, ARS_M3U),
         _apple(M3_ULTRA, "M3 Ultra (high): 80 GPU cores", ARS_M3U))],
        _L2_UNKNOWN, _slc_like(96 * MIB, "two M2 Max dies"))
    + _variants("M4", "Apple9", M4_CLOCK, [
        (8, _stated(120, "Apple M4 (low)", M4_PR, ARS_M4),
         _apple(M4_PR, "Apple M4 (low): 8 GPU cores", ARS_M4)),
        (10, _stated(120, "Apple M4 (high)", M4_PR, ARS_M4),
         _apple(M4_PR, "Apple M4 (high): 10 GPU cores", ARS_M4))],
        _L2_UNKNOWN, _slc_like(8 * MIB, "the M2"))
    + _variants("M4 Pro", "Apple9", M4_PRO_CLOCK, [
        (16, _stated(273, "Apple M4 Pro (low)", M4_PRO_MAX, ARS_M4),
         _apple(M4_PRO_MAX, "Apple M4 Pro (low): 16 GPU cores", ARS_M4)),
        (20, _stated(273, "Apple M4 Pro (high)", M4_PRO_MAX, ARS_M4),
         _apple(M4_PRO_MAX, "Apple M4 Pro (high): 20 GPU cores", ARS_M4))],
        _L2_UNKNOWN, _slc_like(24 * MIB, "the M2 Pro"))
    + _variants("M4 Max", "Apple9", M4_CLOCK, [
        (32, _stated(410, "low-end M4 Max", M4_PRO_MAX, ARS_M4),
         _apple(M4_PRO_MAX, "M4 Max with 32-core GPU", ARS_M4)),
        (40, _stated(546, "fully enabled M4 Max", M4_PRO_MAX, ARS_M4),
         _apple(M4_PRO_MAX, "M4 Max: up to 40-core GPU", ARS_M4))],
        _L2_UNKNOWN, _slc_like(48 * MIB, "the M2 Max"))
    + _variants("M5", "Apple10", M5_CLOCK, [
        (10, _stated(153, "M5", M5_PR, "tomshardware.com"),
         _apple(M5_PR, "10-core GPU with a Neural Accelerator in each core",
                "tomshardware.com"))],
        _L2_UNKNOWN, _slc_like(8 * MIB, "the M2"))
    + _variants("M5 Pro", "Apple10", M5_CLOCK, [
        (20, _stated(307, "M5 Pro", M5_PRO_MAX, LOWYAT),
         _apple(M5_PRO_MAX, "M5 Pro: up to 20 GPU cores", LOWYAT))],
        _L2_UNKNOWN, _slc_like(24 * MIB, "the M2 Pro"))
    + _variants("M5 Max", "Apple10", M5_CLOCK, [
        (32, (460.0, Source("cputronic.com/cpu/apple-m5-max-32-core-gpu", "32-core GPU, 'a "
                            "unified memory bandwidth of around 460 GB/s'", True)),
         _apple(M5_PRO_MAX, "M5 Max with 32-core GPU (MacBook Pro configurations)")),
        (40, _stated(614, "M5 Max", M5_PRO_MAX, LOWYAT),
         _apple(M5_PRO_MAX, "M5 Max: up to 40 GPU cores", LOWYAT))],
        _L2_UNKNOWN, _slc_like(48 * MIB, "the M2 Max"))
)
