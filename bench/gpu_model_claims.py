"""Published measurements of Metal kernels next to what mtwork.gpu's model predicts for them.

Where the kernel is in this repository (kernels/flash_attention, kernels/gated_delta,
kernels/gguf) its counters are the emulator's: the kernel runs with `mtwork.profile` at the
measured shape, or at a part of it taken to the whole exactly (`times`, `at_steps`). The
others (llama.cpp's matrix-vector kernels, a copy, metal-benchmarks' FFMA chains) are
estimated by hand, every estimate stated where it is made. Run (a few minutes: the
profiled kernels run on the emulator):

    python bench/gpu_model_claims.py [--quick]

It prints the table of docs/records/gpu-model.md's "Validation against published
measurements".
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Run as a script, Python puts bench/ first on the path: put this checkout's root first
# so `mtwork` is the one beside this file, not another installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

import mtwork  # noqa: E402
from mtwork.gpu import (  # noqa: E402
    BufferTraffic,
    Counters,
    LaneOps,
    at_steps,
    default_gpu,
    estimate,
    scaled,
)
from mtwork.gpu.counters import SIMD_WIDTH  # noqa: E402
from mtwork.gpu.model import LANE_OP_CYCLES, SIMD_OP_CYCLES  # noqa: E402

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


# --- the repository's kernels, counted by the emulator (profile=True) ---------------------


def times(c: Counters, copies: int) -> Counters:
    """The counts of a dispatch of `copies` copies of `c`'s threadgroups, each copy on data
    of its own that starts on a line (more heads, more batches): `mtwork.gpu.scaled`,
    exact for the kernels below, whose heads and batches touch disjoint lines."""
    return scaled(c, copies)


def flash_attention(simdgroups: int, seq: int = 1536, heads: int = 24) -> Counters:
    """kernels/flash_attention's simdgroup_matrix kernel at seed 001's shape (head_dim
    128, 64 query rows and 32 keys a tile, float32), counted for one head and times
    `heads` (each head's q, k, v and output rows are lines of their own)."""
    family = mtwork.load_family("flash_attention")
    shape = family.Shape(batch=1, heads=1, q_len=seq, kv_len=seq, head_dim=128)
    launch = family.flash_launch(shape, tiles=family.Tiles(64, 32, simdgroups))
    return times(mtwork.profile(launch, *family.make_inputs(shape)), heads)


def gated_delta(packed: bool, batch: int = 1, steps: int = 2048, hv: int = 32) -> Counters:
    """kernels/gated_delta's sequential kernel (one SIMD-group per value row, 4 per
    threadgroup) or its packed twin (8 rows per SIMD-group, 2 per threadgroup) at seed
    002's shape (Dk = Dv = 128, Hk = Hv / 2), counted at 8 and 16 tokens and taken to
    `steps` (every token does the same work), for one batch and times `batch`."""
    return times(at_steps(*_gated_delta_counts(packed, hv), (8, 16), steps), batch)


@cache
def _gated_delta_counts(packed: bool, hv: int) -> tuple[Counters, Counters]:
    family = mtwork.load_family("gated_delta")
    counted = []
    for tokens in (8, 16):
        problem = family.Problem(1, tokens, hv // 2, hv, 128, 128)
        launch = family.packed_launch(problem) if packed else family.seq_launch(problem)
        counted.append(mtwork.profile(launch, *family.make_inputs(problem)))
    return counted[0], counted[1]


def issue_cycles(c: Counters, *, integer: bool = True) -> float:
    """The ALU term's SIMD-group issue cycles, before the busiest core's share and the issue
    efficiency. `integer=False` leaves out integer and integer-multiply operations: the
    emulator counts them from the CPU's code, where loop control and address arithmetic
    remain that Apple's compiler may unroll or fold into a load's addressing."""
    classes = {name: cycles for name, cycles in LANE_OP_CYCLES.items()
               if integer or not name.startswith("integer")}
    lanes = sum(getattr(c.ops, name) * cycles for name, cycles in classes.items())
    return lanes / (SIMD_WIDTH * c.simd_efficiency) + sum(
        getattr(c.simd, name) * cycles for name, cycles in SIMD_OP_CYCLES.items())


# MLX PR #4409's B=8 T=8 speed-up. Its timings include "public-API graph construction,
# dispatch, GPU execution and both outputs"; the model's are GPU time only.
PR_4409_B8_T8 = 1.4144


def host_seconds(pair: list[float], published: float) -> float:
    """The time a call spends outside the GPU, the same for both kernels, that makes the
    modelled GPU times `pair` (before, after) give the `published` speed-up."""
    before, after = pair
    return max(0.0, (before - published * after) / (published - 1))


def in_flight(c: Counters) -> str:
    return "unmeasured" if c.loads_in_flight is None else f"{c.loads_in_flight:.1f}"


def q8_0_dequant(rows: int = 4096, cols: int = 4096) -> Counters:
    """kernels/gguf's q8_0 kernel to float16 (4 weights a thread, 256 threads a
    threadgroup), counted for 64 rows and times rows / 64 (a row is whole lines of blocks
    and of output when `cols` is a multiple of 128)."""
    family = mtwork.load_family("gguf")
    packed = mx.array(family.quants.quantize_q8_0(family.sample_weights(64, cols)))
    return times(mtwork.profile(family.launch("q8_0", packed, mx.float16)), rows // 64)


def flash_and_naive(seq: int = 512, head_dim: int = 64) -> tuple[Counters, Counters]:
    """The flash-attention family's two kernels on one head: the simdgroup_matrix kernel
    (32 query rows and keys a tile, 2 SIMD-groups) and the scalar one."""
    family = mtwork.load_family("flash_attention")
    shape = family.Shape(batch=1, heads=1, q_len=seq, kv_len=seq, head_dim=head_dim)
    inputs = family.make_inputs(shape)
    flash = mtwork.profile(family.flash_launch(shape, tiles=family.Tiles(32, 32, 2)), *inputs)
    return flash, mtwork.profile(family.naive_launch(shape), *inputs)


@dataclass(frozen=True)
class Shapes:
    """The sizes the repository's kernels are counted at: the published ones, or small
    ones that only check that the script runs (--quick)."""

    attention_tokens: int = 1536
    attention_heads: int = 24
    gated_delta_tokens: int = 2048
    value_heads: int = 32
    q8_0_rows: int = 4096
    scalar_attention_tokens: int = 512


QUICK = Shapes(attention_tokens=128, attention_heads=2, gated_delta_tokens=64, value_heads=2,
               q8_0_rows=128, scalar_attention_tokens=64)


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


# --- metal-benchmarks: FFMA32 chains at low occupancy -------------------------------------

def ffma_chain(simdgroups_per_core: int, ilp: int = 1, cores: int = 32) -> Counters:
    """A fixed amount of FFMA32 work in `ilp` independent chains per thread, spread over
    `simdgroups_per_core` SIMD-groups on each core, at most 8 per threadgroup."""
    per_core = max(1, simdgroups_per_core // 8)
    issues = cores * 88 * 100_000
    return Counters("ffma32_chain", threadgroups=cores * per_core,
                    threads_per_threadgroup=32 * simdgroups_per_core // per_core,
                    ops=LaneOps(f32=32 * issues), simd_issues=issues,
                    active_lanes=32 * issues, dependent_issues=issues // ilp)


def ffma_slowdowns(ilp: int) -> tuple[float, float]:
    """Modelled time at 4 and at 8 SIMD-groups per core over the time at 88."""
    low, mid, full = (estimate(ffma_chain(n, ilp), "M1 Max").seconds for n in (4, 8, 88))
    return low / full, mid / full


@dataclass(frozen=True)
class Claim:
    claim: str
    source: str
    published: str
    modelled: str


def claims(shapes: Shapes = Shapes()) -> list[Claim]:
    def ratio(before: Counters, after: Counters, chip: str) -> tuple[float, str, str]:
        b, a = estimate(before, chip), estimate(after, chip)
        return b.seconds / a.seconds, b.limiting_term, a.limiting_term

    sh = shapes
    fa, fa_b, fa_a = ratio(*(flash_attention(n, sh.attention_tokens, sh.attention_heads)
                             for n in (4, 8)), "M3 Max")
    gd_pair = [gated_delta(p, steps=sh.gated_delta_tokens, hv=sh.value_heads)
               for p in (False, True)]
    gd, gd_b, gd_a = ratio(*gd_pair, "M5 Max")
    gd_issue, gd_float = (issue_cycles(gd_pair[0], integer=i) / issue_cycles(gd_pair[1], integer=i)
                          for i in (True, False))
    gd8, gd16 = (ratio(*(gated_delta(p, b, sh.gated_delta_tokens, sh.value_heads)
                         for p in (False, True)), "M5 Max")[0] for b in (8, 16))
    gd_alu = (estimate(gd_pair[0], "M5 Max").term("ALU").seconds
              / estimate(gd_pair[1], "M5 Max").term("ALU").seconds)
    short = {b: [estimate(gated_delta(p, b, 8, sh.value_heads), "M5 Max").seconds
                 for p in (False, True)] for b in (1, 8, 16)}
    gs, gs_b, gs_a = ratio(*(gated_delta(p, steps=8, hv=sh.value_heads) for p in (False, True)),
                           "M5 Max")
    gs8, gs16 = (short[b][0] / short[b][1] for b in (8, 16))
    host = host_seconds(short[8], PR_4409_B8_T8)
    with_host = {b: (s + host) / (p + host) for b, (s, p) in short.items()}
    q8 = estimate(q8_0_dequant(sh.q8_0_rows), "M5 Max")
    scalar, _, _ = ratio(*reversed(flash_and_naive(sh.scalar_attention_tokens)),
                         default_gpu().label)
    decode = estimate(decode_weights(), "M1 Max")
    copy = estimate(stream_copy(), "M1 Max")
    ffma = {k: ffma_slowdowns(k) for k in (1, 2, 3, 4)}
    return [
        Claim("flash attention: 8 instead of 4 SIMD-groups per threadgroup",
              "seed 001 (oxibonsai-kernels, joint_attention_flash_f32); chip not named, "
              "modelled on M3 Max", "~1.5x faster",
              f"{fa:.2f}x faster (limited by {fa_b} -> {fa_a})"),
        Claim("gated delta: 8 value rows per SIMD-group, B=1 T=2048", "seed 002 (MLX "
              "gated_delta_seq), M5 Max; MLX PR #4409 (the same change), M5 Max",
              "1.90x (1.62-2.42); #4409: 1.25x",
              f"{gd:.2f}x (limited by {gd_b} -> {gd_a}); ALU issue cycles {gd_issue:.2f}x "
              f"fewer, {gd_float:.2f}x without integer operations; ILP "
              f"{gd_pair[0].ilp:.2f} -> {gd_pair[1].ilp:.2f}, ALU term {gd_alu:.2f}x; "
              f"loads in flight {in_flight(gd_pair[0])} -> {in_flight(gd_pair[1])}"),
        Claim("the same, B=8 T=2048", "seed 002; #4409", "2.16x (2.05-2.37); #4409: 1.87x",
              f"{gd8:.2f}x"),
        Claim("the same, B=16 T=2048", "seed 002; #4409", "1.86x (1.61-2.53); #4409: 1.89x",
              f"{gd16:.2f}x"),
        Claim("the same, B=1 T=8", "seed 002, M5 Max", "~1.0 (within noise)",
              f"{gs:.2f}x (limited by {gs_b} -> {gs_a}); with {host * 1e6:.0f} µs of host "
              f"time a call: {with_host[1]:.2f}x"),
        Claim("the same, B=8 and B=16, T=8", "seed 002; #4409 (B=8)",
              "1.36-1.43x; #4409: 1.41x (B=8)",
              f"{gs8:.2f}x, {gs16:.2f}x; with {host * 1e6:.0f} µs of host time a call "
              f"(the time that gives #4409's B=8): {with_host[8]:.2f}x, "
              f"{with_host[16]:.2f}x"),
        Claim("GGUF Q8_0 dequantisation is memory-bound", "seed 004 (metaltile #243/#247: "
              "no GFLOP/s for memory-bound dequant kernels), M5 Max", "memory-bound",
              f"{q8.bound}-bound ({q8.limiting_term}), {q8.seconds * 1e6:.0f} µs for 16M weights"),
        Claim("flash attention's simdgroup_matrix kernel against its scalar kernel, one head "
              "of 512 tokens, D=64", f"mtwork's target on sim, modelled on {default_gpu().label}",
              "ranks above", f"{scalar:.1f}x faster"),
        Claim("7B Q4_0 token generation (weights read once)", "llama.cpp PR #2188, M1 Max",
              "22.5 ms/token (25.7 before)",
              f"{decode.seconds * 1e3:.1f} ms ({decode.limiting_term})"),
        Claim("M1 Max sustained GPU bandwidth", "llama.cpp PR #2188: 'GPUs of M1 Max / M2 "
              "Max can sustain 340 GB/s'", "340 GB/s",
              f"{2 * (1 << 30) / copy.seconds / 1e9:.0f} GB/s (1 GiB copy)"),
        *(Claim(f"FFMA32, ILP {k}: time at 4 and 8 vs 88 SIMD-groups per core",
                "metal-benchmarks FFMA table, M1 Max (the model's issue ramp is fitted to it)",
                published, f"{ffma[k][0]:.2f}x, {ffma[k][1]:.2f}x")
          for k, published in ((1, "5.70x, 2.87x"), (2, "4.47x, 2.27x"), (3, "3.30x, 2.04x"),
                               (4, "2.70x, 1.57x"))),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="count the kernels at small sizes: checks that the script runs "
                             "(the table is the published sizes')")
    args = parser.parse_args(argv)
    print("| claim | source | published | modelled |")
    print("| --- | --- | --- | --- |")
    for c in claims(QUICK if args.quick else Shapes()):
        print(f"| {c.claim} | {c.source} | {c.published} | {c.modelled} |")


if __name__ == "__main__":
    main()
