"""The fast engine's pass on small hand-written IR: regions, uniformity, what is kept
across barriers and how, and which kernels may see their threads diverge."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mtwork.backends.sim.engine.cfg import Liveness
from mtwork.backends.sim.engine.ir import IRError, parse_module
from mtwork.backends.sim.engine.loops import mark_reduction_loops
from mtwork.backends.sim.engine.regions import Regions, canonical, form_regions
from mtwork.backends.sim.engine.separable import LANE_COLLECTIVE, run_lane_by_lane
from mtwork.backends.sim.engine.slots import Kind, Plan, plan
from mtwork.backends.sim.engine.transform import _may_diverge, transform
from mtwork.backends.sim.engine.uniformity import Uniformity, analyse, invariant_loads

HEADER = "define void @mtw_engine_thread(ptr %0, ptr %1, i32 %2, i32 %3, i32 %4, i32 %5) #0 {"
FOOTER = "}\nattributes #0 = { nounwind }\ndeclare void @mtw_threadgroup_barrier(i32)\n"

# for (s = 128; s > 0; s >>= 1) { if (x < s) tile[x] += 1; barrier; }  then out[x] = s
TREE = """
  %tile = load ptr, ptr %1
  br label %head

head:
  %s = phi i32 [ 128, %6 ], [ %next, %latch ]
  %low = icmp ult i32 %3, %s
  br i1 %low, label %add, label %latch

add:
  %x64 = zext i32 %3 to i64
  %p = getelementptr float, ptr %tile, i64 %x64
  %v = load float, ptr %p
  %w = fadd float %v, 1.0
  store float %w, ptr %p
  br label %latch

latch:
  call void @mtw_threadgroup_barrier(i32 2)
  %next = lshr i32 %s, 1
  %more = icmp ne i32 %next, 0
  br i1 %more, label %head, label %done

done:
  %sf = uitofp i32 %s to float
  store float %sf, ptr %tile
  ret void
"""


@dataclass
class Analysed:
    regions: Regions
    uniformity: Uniformity
    plan: Plan
    names: dict[str, str]  # the test's value names -> canonical names

    def kind(self, name: str) -> Kind:
        return self.plan.kinds[self.names[name]]

    def uniform(self, name: str) -> bool:
        return self.uniformity.uniform(self.names[name])


def analysed(body: str, marked: int | None = None) -> Analysed:
    """The pass's analyses of `body`; `marked`: first put implicit syncs into its
    reduction loops (transform does), expecting that many loops marked."""
    module = parse_module(f"{HEADER}\n{body}\n{FOOTER}")
    original = module.functions["@mtw_engine_thread"]
    function = canonical(original)
    names = {}
    for before, after in zip(original.blocks, function.blocks):
        for a, b in zip(before.instructions, after.instructions):
            if a.result:
                names[a.result[1:]] = b.result
    if marked is not None:
        assert mark_reduction_loops(function) == marked
    regions = form_regions(function)
    liveness = Liveness.of(regions.function, regions.graph)
    roots = ("%g", "%buffers")
    uniformity = analyse(regions.function, regions.graph, ("%i", "%x", "%y", "%z"), roots,
                         frozenset())
    return Analysed(regions, uniformity,
                    plan(regions, liveness, uniformity, invariant_loads(regions.function, roots)),
                    names)


def test_a_barrier_in_a_loop_makes_three_regions_sharing_the_loop() -> None:
    a = analysed(TREE)
    assert len(a.regions.syncs) == 1
    entry, after = a.regions.regions[0], a.regions.regions[1]
    assert entry.exits == [0] and after.exits == [0]
    # After the barrier threads go round the loop again or leave it: the loop's header
    # and body are in both regions, copied into each.
    head = next(b.name for b in a.regions.function.blocks if any(
        i.result == a.names["s"] for i in b.instructions))
    assert head in entry.blocks and head in after.blocks
    assert any(a.regions.function.block_map()[b].terminator.opcode == "ret"
               for b in after.blocks)


def test_a_loop_counter_is_uniform_while_the_thread_index_is_not() -> None:
    a = analysed(TREE)
    assert a.uniform("s") and a.uniform("next") and a.uniform("tile")
    assert not a.uniform("low") and not a.uniform("x64") and not a.uniform("v")
    # Kept once per threadgroup across the barrier; the buffer read from the table is
    # loaded again after it.
    assert a.kind("s") is Kind.UNIFORM
    assert a.kind("tile") is Kind.RECOMPUTED
    assert not _may_diverge(a.regions, a.uniformity.divergent_blocks)


def test_a_phi_where_a_divergent_branch_joins_is_divergent() -> None:
    a = analysed("""
  %odd = and i32 %3, 1
  %c = icmp eq i32 %odd, 0
  br i1 %c, label %even, label %join

even:
  br label %join

join:
  %k = phi i32 [ 1, %even ], [ 2, %6 ]
  call void @mtw_threadgroup_barrier(i32 2)
  %t = load ptr, ptr %1
  store i32 %k, ptr %t
  ret void
""")
    assert not a.uniform("k")
    assert a.kind("k") is Kind.THREAD


def test_a_loop_threads_leave_at_different_times_has_a_divergent_counter() -> None:
    a = analysed("""
  br label %head

head:
  %n = phi i32 [ 0, %6 ], [ %n1, %head ]
  %n1 = add i32 %n, 1
  %again = icmp ult i32 %n1, %3
  br i1 %again, label %head, label %out

out:
  call void @mtw_threadgroup_barrier(i32 2)
  %t = load ptr, ptr %1
  store i32 %n1, ptr %t
  ret void
""")
    assert not a.uniform("n") and not a.uniform("n1")


def test_values_computed_from_the_thread_position_are_recomputed_not_kept() -> None:
    a = analysed("""
  %t = load ptr, ptr %1
  %x64 = zext i32 %3 to i64
  %p = getelementptr float, ptr %t, i64 %x64
  %v = load float, ptr %p
  call void @mtw_threadgroup_barrier(i32 2)
  store float %v, ptr %p
  ret void
""")
    assert a.kind("p") is Kind.RECOMPUTED  # from the buffer table and x, again
    assert a.kind("v") is Kind.THREAD  # a load of device memory: kept per thread
    after_barrier = a.plan.stored_at[0]
    assert after_barrier == [a.names["v"]]


ALLOCAS = """
  %kept = alloca [4 x float], align 16
  %scratch = alloca [4 x float], align 16
  call void @llvm.lifetime.start.p0(ptr %scratch)
  store float 1.0, ptr %scratch
  call void @llvm.lifetime.end.p0(ptr %scratch)
  store float 2.0, ptr %kept
  call void @mtw_threadgroup_barrier(i32 2)
  call void @llvm.lifetime.start.p0(ptr %scratch)
  %a = load float, ptr %kept
  store float %a, ptr %scratch
  call void @llvm.lifetime.end.p0(ptr %scratch)
  ret void
"""


def test_an_array_dead_at_every_barrier_stays_private() -> None:
    a = analysed(ALLOCAS)
    assert a.kind("kept") is Kind.CONTEXT_ALLOCA  # written before, read after
    assert a.kind("scratch") is Kind.PRIVATE_ALLOCA  # outside its lifetime at the barrier


def test_threads_returning_before_a_barrier_may_diverge() -> None:
    a = analysed("""
  %c = icmp ult i32 %2, 100
  br i1 %c, label %work, label %leave

work:
  call void @mtw_threadgroup_barrier(i32 2)
  br label %leave

leave:
  ret void
""")
    assert _may_diverge(a.regions, a.uniformity.divergent_blocks)


def test_a_kernel_without_a_per_thread_entry_is_refused() -> None:
    with pytest.raises(IRError, match="has no mtw_engine_thread"):
        transform("define void @f() {\n  ret void\n}\n")


def test_a_switch_keeps_every_case_as_a_successor() -> None:
    module = parse_module(f"""{HEADER}
  switch i32 %3, label %d [
    i32 0, label %a
    i32 1, label %b
  ]

a:
  ret void

b:
  ret void

d:
  ret void
{FOOTER}""")
    block = module.functions["@mtw_engine_thread"].blocks[0]
    assert block.successors() == ["%d", "%a", "%b"]
    again = parse_module(module.text()).functions["@mtw_engine_thread"].blocks[0]
    assert again.successors() == ["%d", "%a", "%b"]


# A simdgroup_load of `%tile` into `%m`, as the shim's inlined call reads: the lane's
# argument record and matrix are its own allocas. `{before}` runs first.
TILE_LOAD = """
  %arg = alloca {{ ptr, i64 }}, align 8
  %m = alloca <2 x float>, align 8
  %tile = load ptr, ptr %1
  {before}
  store ptr %tile, ptr %arg
  call void @mtw_simd_collective(ptr %arg, ptr %m, ptr @_ZN12mtw_sgmatrix4loadIfEEvPKPKvPKPvj)
  %v = load <2 x float>, ptr %m
  ret void
"""


def lane_by_lane(before: str) -> list[str]:
    """The calls left in the kernel after the pass, by callee."""
    module = parse_module(f"{HEADER}\n{TILE_LOAD.format(before=before)}\n{FOOTER}")
    function = canonical(module.functions["@mtw_engine_thread"])
    run_lane_by_lane(function)
    return [i.callee for b in function.blocks for i in b.instructions if i.callee]


def test_a_tile_load_with_nothing_written_around_it_runs_lane_by_lane() -> None:
    assert lane_by_lane("") == [LANE_COLLECTIVE]


def test_a_tile_load_after_a_store_to_shared_memory_stays_a_sync_point() -> None:
    calls = lane_by_lane("store float 1.0, ptr %tile")
    assert calls == ["@mtw_simd_collective"]


def test_a_barrier_between_the_store_and_the_tile_load_lets_it_run_lane_by_lane() -> None:
    calls = lane_by_lane("store float 1.0, ptr %tile\n  call void @mtw_threadgroup_barrier(i32 2)")
    assert calls == ["@mtw_threadgroup_barrier", LANE_COLLECTIVE]


# s = 0; for (j = x; j < 1000; j += 256) s += row[j] * row[j] + 1; barrier; row[x] = s * u,
# with u the same in every thread
REDUCTION = """
  %row = load ptr, ptr %1
  %k = load float, ptr %0
  %u = fmul float %k, 2.0
  %start = zext i32 %3 to i64
  br label %head

head:
  %j = phi i64 [ %start, %6 ], [ %j1, %head ]
  %s = phi float [ 0.0, %6 ], [ %s1, %head ]
  %p = getelementptr float, ptr %row, i64 %j
  %v = load float, ptr %p
  %sq = fmul float %v, %v
  %t = fadd float %sq, 1.0
  %s1 = fadd float %s, %t
  %j1 = add i64 %j, 256
  %more = icmp ult i64 %j1, 1000
  br i1 %more, label %head, label %done

done:
  call void @mtw_threadgroup_barrier(i32 2)
  %q = getelementptr float, ptr %row, i64 %start
  %w = fmul float %s1, %u
  store float %w, ptr %q
  ret void
"""


def test_a_reduction_loop_runs_an_iteration_per_region_between_implicit_syncs() -> None:
    a = analysed(REDUCTION, marked=1)
    head, done, barrier = a.regions.syncs
    assert head.implicit and done.implicit and not barrier.implicit
    iteration = a.regions.regions[a.regions.region_after(head.index)]
    assert sorted(iteration.exits) == [head.index, done.index]  # again, or out of the loop
    assert a.kind("j") is Kind.THREAD and a.kind("s") is Kind.THREAD
    # Uniform, but threads pass the loop's head a different number of times (the trip
    # count depends on x) and may then run on one by one: kept per thread across it,
    # once per group across the barrier.
    u = a.names["u"]
    assert a.kind("u") is Kind.UNIFORM and a.plan.per_thread(u)
    assert not a.plan.uniform_across(u, head.index)
    assert a.plan.uniform_across(u, barrier.index)
    # Threads that leave the loop at different times meet again at the barrier.
    assert not _may_diverge(a.regions, a.uniformity.divergent_blocks)


@pytest.mark.parametrize("changes", [
    [("  %s1 = fadd float %s, %t\n", "  %s1 = fadd float %s, %t\n  store float %s1, ptr %p\n")],
    [("phi float [ 0.0, %6 ]", "phi i32 [ 0, %6 ]"), ("fadd float %s, %t", "add i32 %s, 1"),
     ("fmul float %s1, %u", "uitofp i32 %s1 to float")],
    [("fmul float %v, %v", "bitcast float %v to float"), ("fadd float %sq, 1.0",
                                                          "bitcast float %sq to float")],
    [("  %j1 = add i64 %j, 256\n",
      "  %j1 = add i64 %j, 256\n  call void @mtw_simd_collective(ptr %p, ptr %p, ptr @f)\n")],
], ids=["stores", "carries no float", "one operation", "SIMD-group functions"])
def test_a_loop_that_stores_carries_no_float_works_little_or_meets_its_simd_group_stays(
        changes: list[tuple[str, str]]) -> None:
    body = REDUCTION
    for old, new in changes:
        body = body.replace(old, new)
    function = canonical(parse_module(f"{HEADER}\n{body}\n{FOOTER}").functions[
        "@mtw_engine_thread"])
    assert mark_reduction_loops(function) == 0
