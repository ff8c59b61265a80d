"""Published measurements of Metal kernels next to what mtwork.gpu's model predicts for them.

The counters here are estimated by hand from each kernel's source or description (every
estimate is stated where it is made); the emulator's own counters will replace them. Run:

    python bench/gpu_model_claims.py

It prints the table of docs/gpu-model.md's "Validation against published measurements".
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

# Run as a script, Python puts bench/ first on the path: put this checkout's root first
# so `mtwork` is the one beside this file, not another installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtwork.gpu import BufferTraffic, Counters, LaneOps, SimdOps, estimate  # noqa: E402

LINE = 128


def traffic(name: str, *, accesses: int, lines_per_access: float, bytes_per_access: int,
            distinct_bytes: int, store: bool = False) -> BufferTraffic:
    """A buffer's traffic from per-access figures: `accesses` SIMD-group accesses, each
    touching `lines_per_access` lines and requesting `bytes_per_access` bytes."""
    moved = math.ceil(accesses * lines_per_access)
    requested = accesses * bytes_per_access
    kind = {"store_bytes": requested, "stores": accesses} if store else {
        "load_bytes": requested, "loads": accesses}
    return BufferTraffic(name, transactions=moved,
                         distinct_lines=min(moved, math.ceil(distinct_bytes / LINE)), **kind)


# --- seed 001: flash attention, 8 vs 4 SIMD-groups per threadgroup ------------------------

def flash_attention(simdgroups: int, seq: int = 1536, heads: int = 24) -> Counters:
    """joint_attention_flash_f32 at the DiT shape (head_dim 128, BQ 64, BK 32).

    Per threadgroup and key tile: K staged transposed (lanes read 32 different rows: 32
    lines per access), V staged coalesced, Q's 8x8 fragments loaded from device (8 rows
    of 32 bytes: 8 lines). simdgroup_load/store of an 8x8 float tile with a 32- or
    128-float row stride puts its 8 rows on the same 8 banks: 8 wavefronts instead of 2
    (MLX pads such tiles). The softmax (64 rows, 2 SIMD-groups) reads row-major S with
    lanes = rows, a 32-way conflict. Registers estimated from the fragments a SIMD-group
    holds: O is 128/8 × 2 floats per lane per 8-row strip: 8 SIMD-groups hold one strip
    (~72 registers), 4 hold two (~112).
    """
    mfrags = 64 // (8 * simdgroups)  # 8-row strips per SIMD-group
    tiles, tgs = math.ceil(seq / 32), math.ceil(seq / 64) * heads
    walks = tiles * tgs  # (threadgroup, key tile) pairs
    k_frag_loads = 16 * 4 * simdgroups  # per tile: shared by a SIMD-group's strips
    v_frag_loads = 4 * 16 * simdgroups
    p_loads = s_stores = 4 * mfrags * simdgroups
    diag = simdgroups * mfrags  # 8x8 diagonal tiles (row stride 8: no conflict)
    strided = k_frag_loads + v_frag_loads + p_loads + s_stores  # 8 wavefronts each
    softmax = 2 * (2 * 32 + 32)  # two SIMD-groups: two reads and one write per key
    # 2 wavefronts per 8x8 tile, diag written and read, K and V staged (128 each),
    # softmax, ~10 for the running max/sum/correction rows.
    accesses = 2 * (strided + 2 * diag) + 256 + softmax + 10
    conflicts = 6 * strided + 31 * softmax
    mmas = (16 * 4 + 4 * 16 + 16) * mfrags * simdgroups  # S, O += P·V, diag rescale
    tensor = heads * seq * 128 * 4
    return Counters(
        "flash_attention", threadgroups=tgs, threads_per_threadgroup=32 * simdgroups,
        threadgroup_memory=(32 * 128 + 64 * 32 + 3 * 64 + simdgroups * mfrags * 64) * 4,
        registers=72 if simdgroups == 8 else 112,
        buffers=(traffic("k", accesses=128 * walks, lines_per_access=32, bytes_per_access=128,
                         distinct_bytes=tensor),
                 traffic("v", accesses=128 * walks, lines_per_access=1, bytes_per_access=128,
                         distinct_bytes=tensor),
                 traffic("q", accesses=128 * walks, lines_per_access=8, bytes_per_access=256,
                         distinct_bytes=tensor),
                 traffic("out", accesses=256 * tgs, lines_per_access=1, bytes_per_access=128,
                         distinct_bytes=tensor, store=True)),
        threadgroup_accesses=accesses * walks, bank_conflicts=conflicts * walks,
        threadgroup_barriers=5 * walks,
        ops=LaneOps(integer=49152 * walks, f32=12288 * walks, exp_log=4096 * walks),
        simd=SimdOps(mma_f32=mmas * walks))


# --- seed 002: gated delta, one vs eight value rows per SIMD-group --------------------------

def gated_delta(packed: bool, batch: int = 1, steps: int = 2048, hv: int = 32) -> Counters:
    """MLX's sequential gated_delta step, Dk = Dv = 128; Hv = 32 assumed for the bench.

    Unpacked: a SIMD-group per value row, 4 state elements per lane; per step it loads q
    and k (one 512-byte access each, 4 lines), v, g, beta (broadcasts), runs ~18 FP32 and
    ~4 integer ops per lane and two simd_sum. Packed: 8 rows per SIMD-group, 4 lanes per
    row, 32 elements per lane: q and k as 8 float4 accesses each (the 8 row groups read
    the same 4 × 16 bytes, spread over 4 lines), ~130 FP32 ops per lane, the sums as in-lane trees
    and 4 simd_shuffle_xor per step. Registers ~24 unpacked, ~100 packed (estimates).
    """
    heads = batch * hv
    rows_per_simd = 8 if packed else 1
    simds = 128 // rows_per_simd * heads
    simd_steps = simds * steps
    per_tg = 2 if packed else 4
    qk_accesses = 8 if packed else 1
    qk_bytes = 64 if packed else 512  # packed: 4 distinct 16-byte pieces per access
    tensor_qk = batch * steps * 16 * 128 * 4  # Hk = 16 key heads
    return Counters(
        "gated_delta_seq", threadgroups=simds // per_tg, threads_per_threadgroup=32 * per_tg,
        registers=100 if packed else 24,
        buffers=(traffic("q", accesses=qk_accesses * simd_steps, lines_per_access=4,
                         bytes_per_access=qk_bytes, distinct_bytes=tensor_qk),
                 traffic("k", accesses=qk_accesses * simd_steps, lines_per_access=4,
                         bytes_per_access=qk_bytes, distinct_bytes=tensor_qk),
                 traffic("v_g_beta", accesses=3 * simd_steps, lines_per_access=1,
                         bytes_per_access=4 * rows_per_simd,
                         distinct_bytes=batch * steps * hv * 130 * 4),
                 traffic("y", accesses=simd_steps, lines_per_access=1,
                         bytes_per_access=4 * rows_per_simd,
                         distinct_bytes=batch * steps * hv * 128 * 4, store=True)),
        ops=LaneOps(f32=(130 if packed else 18) * 32 * simd_steps,
                    integer=(6 if packed else 4) * 32 * simd_steps),
        simd=SimdOps(shuffles=4 * simd_steps if packed else 0,
                     reductions=0 if packed else 2 * simd_steps))


# --- seed 004: GGUF Q8_0 dequantisation --------------------------------------------------

def q8_0_dequant(weights: int = 4096 * 4096) -> Counters:
    """One thread per weight, a SIMD-group per 32-weight block; the host splits the blocks
    into packed quants (32 bytes a block, one line per SIMD-group access) and fp16 scales
    (a broadcast); fp16 out. ~4 integer ops, a conversion and a multiply per weight."""
    blocks = weights // 32
    return Counters(
        "q8_0_dequant", threadgroups=weights // 256, threads_per_threadgroup=256,
        buffers=(traffic("quants", accesses=blocks, lines_per_access=1, bytes_per_access=32,
                         distinct_bytes=weights),
                 traffic("scales", accesses=blocks, lines_per_access=1, bytes_per_access=2,
                         distinct_bytes=blocks * 2),
                 traffic("out", accesses=blocks, lines_per_access=1, bytes_per_access=64,
                         distinct_bytes=weights * 2, store=True)),
        ops=LaneOps(integer=4 * weights, convert=weights, f16=weights))


# --- llama.cpp #2188: Q4_0 matrix-vector products of a 7B model on an M1 Max ---------------

def decode_weights(gib: float = 3.56) -> Counters:
    """One token's matrix-vector products: every weight byte read once, coalesced (the
    model's best case for the kernel; activations ignored)."""
    nbytes = int(gib * (1 << 30))
    accesses = nbytes // 512  # 16-byte loads per lane
    return Counters(
        "q4_0_matvec", threadgroups=accesses // 8, threads_per_threadgroup=64,
        buffers=(traffic("weights", accesses=accesses, lines_per_access=4,
                         bytes_per_access=512, distinct_bytes=nbytes),),
        ops=LaneOps(integer=accesses * 32 * 16, f32=accesses * 32 * 16))


def stream_copy(nbytes: int = 1 << 30) -> Counters:
    accesses = nbytes // 128
    return Counters("copy", threadgroups=accesses // 8, threads_per_threadgroup=256,
                    buffers=(traffic("in", accesses=accesses, lines_per_access=1,
                                     bytes_per_access=128, distinct_bytes=nbytes),
                             traffic("out", accesses=accesses, lines_per_access=1,
                                     bytes_per_access=128, distinct_bytes=nbytes,
                                     store=True)),
                    ops=LaneOps(integer=2 * accesses * 32))


# --- metal-benchmarks: dependent FFMA32 chains at low occupancy ----------------------------

def ffma_chain(simdgroups_per_core: int, cores: int = 32) -> Counters:
    """A fixed amount of FFMA32 work (dependent chains, ILP 1) spread over
    `simdgroups_per_core` SIMD-groups on each core, at most 8 per threadgroup."""
    per_core = max(1, simdgroups_per_core // 8)
    return Counters("ffma32_chain", threadgroups=cores * per_core,
                    threads_per_threadgroup=32 * simdgroups_per_core // per_core,
                    ops=LaneOps(f32=cores * 88 * 32 * 100_000))


@dataclass(frozen=True)
class Claim:
    claim: str
    source: str
    published: str
    modelled: str


def claims() -> list[Claim]:
    def ratio(before: Counters, after: Counters, chip: str) -> tuple[float, str, str]:
        b, a = estimate(before, chip), estimate(after, chip)
        return b.seconds / a.seconds, b.limiting_term, a.limiting_term

    fa, fa_b, fa_a = ratio(flash_attention(4), flash_attention(8), "M3 Max")
    gd, gd_b, gd_a = ratio(gated_delta(False), gated_delta(True), "M5 Max")
    gd8, _, _ = ratio(gated_delta(False, batch=8), gated_delta(True, batch=8), "M5 Max")
    gs, gs_b, gs_a = ratio(gated_delta(False, steps=8), gated_delta(True, steps=8), "M5 Max")
    q8 = estimate(q8_0_dequant(), "M5 Max")
    decode = estimate(decode_weights(), "M1 Max")
    copy = estimate(stream_copy(), "M1 Max")
    low, mid, full = (estimate(ffma_chain(n), "M1 Max").seconds for n in (4, 8, 88))
    return [
        Claim("flash attention: 8 instead of 4 SIMD-groups per threadgroup",
              "seed 001 (oxibonsai-kernels, joint_attention_flash_f32); chip not named, "
              "modelled on M3 Max", "~1.5x faster",
              f"{fa:.2f}x faster (limited by {fa_b} -> {fa_a})"),
        Claim("gated delta: 8 value rows per SIMD-group, B=1 T=2048", "seed 002 (MLX "
              "gated_delta_seq), M5 Max", "1.90x (1.62-2.42)",
              f"{gd:.2f}x (limited by {gd_b} -> {gd_a})"),
        Claim("the same, B=8 T=2048", "seed 002, M5 Max", "2.16x (2.05-2.37)", f"{gd8:.2f}x"),
        Claim("the same, B=1 T=8", "seed 002, M5 Max", "~1.0 (within noise)",
              f"{gs:.2f}x (limited by {gs_b} -> {gs_a})"),
        Claim("GGUF Q8_0 dequantisation is memory-bound", "seed 004 (metaltile #243/#247: "
              "no GFLOP/s for memory-bound dequant kernels), M5 Max", "memory-bound",
              f"{q8.bound}-bound ({q8.limiting_term}), {q8.seconds * 1e6:.0f} µs for 16M weights"),
        Claim("7B Q4_0 token generation (weights read once)", "llama.cpp PR #2188, M1 Max",
              "22.5 ms/token (25.7 before)",
              f"{decode.seconds * 1e3:.1f} ms ({decode.limiting_term})"),
        Claim("M1 Max sustained GPU bandwidth", "llama.cpp PR #2188: 'GPUs of M1 Max / M2 "
              "Max can sustain 340 GB/s'", "340 GB/s",
              f"{2 * (1 << 30) / copy.seconds / 1e9:.0f} GB/s (1 GiB copy)"),
        Claim("FFMA32 chains: time at 4 and 8 vs 88 SIMD-groups per core (ILP 1)",
              "metal-benchmarks FFMA table, M1 Max (the model's issue ramp is fitted to it)",
              "5.70x, 2.87x", f"{low / full:.2f}x, {mid / full:.2f}x"),
    ]


def main() -> None:
    print("| claim | source | published | modelled |")
    print("| --- | --- | --- | --- |")
    for c in claims():
        print(f"| {c.claim} | {c.source} | {c.published} | {c.modelled} |")


if __name__ == "__main__":
    main()
