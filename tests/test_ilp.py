"""The ILP measure (backends/sim/count/ilp.py, `Counters.ilp`): small functions whose dependency
chains are known, with references worked out from the definition (a region's operations
over its critical path, constant loops unrolled and overlapped, other loops one iteration
at a time), and kernels profiled end to end."""

from dataclasses import replace

import mlx.core as mx
import pytest

import mtwork
from bench import gpu_model_claims as claims
from mtwork.backends.sim.count.ilp import chains
from mtwork.backends.sim.count.llvm_ir import Module
from mtwork.gpu import Counters, estimate
from mtwork.gpu.model import ILP_GAIN, ilp_gain

FLOAT_OPS = ("fadd", "fmul")


def region_ilp(ir: str, block: str) -> float:
    """The ILP `chains` gives `block` of the only function in `ir`, where each fadd and
    fmul is one operation and one step of a chain."""
    f = Module(ir).functions[0]
    ops = [sum(i.opcode in FLOAT_OPS for i in b.instructions) for b in f.blocks]
    shares = chains(f, ops, lambda ins: int(ins.opcode in FLOAT_OPS))
    b = next(i for i, blk in enumerate(f.blocks) if blk.label == f"%{block}")
    return ops[b] / shares[b]


def straight(chained: bool) -> str:
    """Four additions: each on the last one's result, or each on an argument."""
    lines = [f"  %a{i} = fadd float {f'%a{i - 1}' if chained and i else '%x'}, 1.0"
             for i in range(4)]
    return "\n".join(["define void @f(float %x) {", "entry:", *lines, "  ret void", "}"])


def loop(accumulators: int, bound: str = "8", fresh_per_outer: bool = False) -> str:
    """A loop adding %x to `accumulators` independent sums, `bound` iterations (a
    constant, or %n: unknown)."""
    phis = [f"  %a{j} = phi float [ 0.0, %entry ], [ %a{j}.next, %loop ]"
            for j in range(accumulators)]
    adds = [f"  %a{j}.next = fadd float %a{j}, %x" for j in range(accumulators)]
    return "\n".join([
        "define void @f(float %x, i32 %n) {", "entry:", "  br label %loop", "loop:",
        "  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]", *phis, *adds,
        "  %i.next = add i32 %i, 1", f"  %done = icmp eq i32 %i.next, {bound}",
        "  br i1 %done, label %exit, label %loop", "exit:", "  ret void", "}"])


def private_array(moving: bool) -> str:
    """Eight iterations of s[j] *= x, where j is the iteration (each its own element) or
    always 0 (every iteration reads what the last one wrote)."""
    index = "%i" if moving else "0"
    return "\n".join([
        "define void @f(float %x) {", "entry:", "  %s = alloca [8 x float], align 4",
        "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]",
        f"  %p = getelementptr inbounds float, ptr %s, i64 {index}",
        "  %v = load float, ptr %p, align 4", "  %w = fmul float %v, %x",
        "  store float %w, ptr %p, align 4", "  %i.next = add i64 %i, 1",
        "  %done = icmp eq i64 %i.next, 8", "  br i1 %done, label %exit, label %loop",
        "exit:", "  ret void", "}"])


def nested(chains_per_outer_iteration: int) -> str:
    """An outer loop of unknown length; in it, `chains_per_outer_iteration` iterations of
    a constant loop, each a fresh sum of 4 additions (an inner constant loop)."""
    return "\n".join([
        "define void @f(float %x, i32 %n) {", "entry:", "  br label %outer", "outer:",
        "  %t = phi i32 [ 0, %entry ], [ %t.next, %outer.end ]", "  br label %p.head",
        "p.head:", "  %p = phi i32 [ 0, %outer ], [ %p.next, %p.end ]", "  br label %inner",
        "inner:", "  %i = phi i32 [ 0, %p.head ], [ %i.next, %inner ]",
        "  %acc = phi float [ 0.0, %p.head ], [ %acc.next, %inner ]",
        "  %acc.next = fadd float %acc, %x", "  %i.next = add i32 %i, 1",
        "  %i.done = icmp eq i32 %i.next, 4", "  br i1 %i.done, label %p.end, label %inner",
        "p.end:", "  %p.next = add i32 %p, 1",
        f"  %p.done = icmp eq i32 %p.next, {chains_per_outer_iteration}",
        "  br i1 %p.done, label %outer.end, label %p.head", "outer.end:",
        "  %t.next = add i32 %t, 1", "  %t.done = icmp eq i32 %t.next, %n",
        "  br i1 %t.done, label %exit, label %outer", "exit:", "  ret void", "}"])


def test_a_chain_of_dependent_additions_has_ilp_1_and_independent_ones_4():
    assert region_ilp(straight(chained=True), "entry") == 1.0  # 4 operations, 4 steps
    assert region_ilp(straight(chained=False), "entry") == 4.0  # 4 operations, 1 step


@pytest.mark.parametrize("accumulators", [1, 2, 4])
def test_a_constant_loop_overlaps_its_iterations_up_to_the_accumulator_chains(accumulators):
    # Unrolled, 8 iterations are 8 × k additions on k chains of 8 steps each.
    assert region_ilp(loop(accumulators), "loop") == pytest.approx(accumulators)


@pytest.mark.parametrize("accumulators", [1, 4])
def test_a_loop_of_unknown_length_runs_one_iteration_at_a_time(accumulators):
    # One iteration: k additions in one step.
    assert region_ilp(loop(accumulators, bound="%n"), "loop") == pytest.approx(accumulators)


def test_a_constant_loop_whose_trip_count_is_not_reached_counts_as_unknown():
    # i + 1 == -1 never holds for i = 0, 1, ...: the loop is taken as one of unknown
    # length, one iteration (one step) at a time.
    assert region_ilp(loop(2, bound="-1"), "loop") == pytest.approx(2)


def test_private_array_elements_of_their_own_make_independent_iterations():
    assert region_ilp(private_array(moving=True), "loop") == pytest.approx(8)  # 8 in 1 step
    assert region_ilp(private_array(moving=False), "loop") == pytest.approx(1)  # 8 in 8


@pytest.mark.parametrize("partials", [1, 8])
def test_fresh_sums_of_a_constant_loop_are_independent_chains(partials):
    # Per outer iteration: `partials` sums of 4 additions, all overlapped: 4 × partials
    # operations in 4 steps (the packed gated-delta kernel's eight partial sums).
    assert region_ilp(nested(partials), "inner") == pytest.approx(partials)


# --- end to end: profiled kernels ---------------------------------------------------------

N = 256


def accumulating_kernel(chains: int) -> mtwork.Kernel:
    """Each thread sums in0[0 .. n) times x into `chains` accumulators (a loop whose
    length n is read at run time, so it stays a loop of unknown length)."""
    adds = "\n".join(f"  acc{j} = fma(in0[i + {j}], x, acc{j});" for j in range(chains))
    body = "\n".join([
        "const uint n = uint(in1[0]);", "const float x = in0[thread_position_in_grid.x];",
        *(f"float acc{j} = 0.0f;" for j in range(chains)),
        f"for (uint i = 0; i + {chains} <= n; i += {chains}) {{", adds, "}",
        "out[thread_position_in_grid.x] = "
        + " + ".join(f"acc{j}" for j in range(chains)) + ";"])
    return mtwork.metal_kernel(f"accumulate{chains}", ["in0", "in1"], ["out"], body)


def ilp_of(chains: int) -> float:
    kernel = accumulating_kernel(chains)
    x = mx.arange(N, dtype=mx.float32) / N
    n = mx.array([64], dtype=mx.int32)
    kernel(inputs=[x, n], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
           output_dtypes=[mx.float32], profile=True, isolate=False)
    c = kernel.last_counters
    assert 0 < c.dependent_issues <= c.simd_issues
    return c.ilp


def test_profiled_kernels_with_more_accumulators_have_more_ilp():
    one, four = ilp_of(1), ilp_of(4)
    # The loop's iteration is the region: one FMA chain plus the loop's counter and test
    # (independent of it) against four chains and the same control.
    assert 1.0 <= one < 2.5
    assert four > 1.8 * one


def test_gated_delta_packed_keeps_more_independent_chains_than_sequential():
    # Seed 002's packed layout: eight partial sums per lane where the sequential layout
    # has one, so fewer SIMD-groups per core suffice for the ALU. At this small shape two
    # SIMD-groups share a core: with ILP above 4 they issue as 2 × 1.97 of ILP 1.
    seq, packed = (claims.gated_delta(p, steps=64, hv=2) for p in (False, True))
    assert packed.ilp > 2 * seq.ilp > 2
    alu = [estimate(c, "M5 Max").term("ALU").seconds
           for c in (replace(packed, dependent_issues=0), packed)]
    assert alu[0] / alu[1] == pytest.approx(ILP_GAIN[-1])


# --- the model's use of it ----------------------------------------------------------------

# metal-benchmarks' FFMA32 table (M1 Max): cycles per instruction at 4, 8 and 88
# SIMD-groups per core, by ILP.
FFMA32_CYCLES = {1: (11.34, 5.71, 1.99), 2: (8.36, 4.24, 1.87), 3: (4.46, 2.75, 1.35),
                 4: (2.75, 1.60, 1.02)}


@pytest.mark.parametrize("ilp", [1, 2, 3, 4])
def test_independent_chains_let_fewer_simdgroups_issue_as_measured(ilp):
    low, mid, full = FFMA32_CYCLES[ilp]
    modelled = claims.ffma_slowdowns(ilp)
    assert modelled == pytest.approx((low / full, mid / full), rel=0.17)


def test_ilp_does_not_change_a_fully_occupied_core():
    full = [estimate(claims.ffma_chain(88, k), "M1 Max").seconds for k in (1, 4)]
    assert full[0] == full[1]


def test_counters_carry_the_ilp_and_check_it():
    c = claims.ffma_chain(8, ilp=4)
    assert c.ilp == 4.0 and Counters.from_dict(c.to_dict()) == c
    assert (c + c).dependent_issues == 2 * c.dependent_issues
    assert replace(c, dependent_issues=0).ilp == 1.0  # not measured: one chain
    assert "ILP (issues / dependent issues)" in str(c)
    with pytest.raises(ValueError, match="dependent_issues=.* exceeds simd_issues"):
        replace(c, dependent_issues=c.simd_issues + 1)


def test_ilp_gain_is_interpolated_and_held_beyond_the_table():
    assert [ilp_gain(k) for k in (1, 2, 3, 4)] == list(ILP_GAIN)
    assert ilp_gain(2.5) == pytest.approx((ILP_GAIN[1] + ILP_GAIN[2]) / 2)
    assert ilp_gain(11.0) == ilp_gain(0.5 + 3.5) and ilp_gain(0.5) == 1.0
