"""The engine's pass over a kernel library's IR: the per-thread entry in, region functions
and a driver that runs them for whole threadgroups out.

Input: the module of the engine's translation unit after clang's -O1 (everything
inlined into `@mtw_engine_thread(g, buffers, i, x, y, z)`, in SSA form). Output: the
same module with `@mtw_entry_barrier_free(g, buffers)`, which runs each region for every
thread of the group (`mtw_engine_run`), then the region the threads went to next, until
they return; every other function becomes internal, so that only the driver remains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .cfg import Liveness
from .emit import NEXT, Layout, region_function
from .ir import Function, Instruction, IRError, Module, parse_module
from .loops import mark_reduction_loops
from .regions import BARRIER, COLLECTIVE, Regions, canonical, form_regions
from .separable import run_lane_by_lane
from .slots import plan
from .types import named_types
from .uniformity import analyse, invariant_loads

__all__ = ["ENTRY", "Transformed", "transform"]

ENTRY = "@mtw_engine_thread"
_TG_ALLOC = "@mtw_engine_tg_alloc"
_KEPT = ("@mtw_entry", "@mtw_entry_barrier_free")
# Runtime functions a kernel may call, and why the engine cannot run a kernel calling
# each one it does not handle.
@dataclass(frozen=True)
class Transformed:
    text: str  # the module's IR
    barriers: int
    regions: int
    kept: dict[str, int]  # how many values of each kind live across barriers
    may_diverge: bool  # threads may leave a region at different barriers


def _call_arguments(text: str, callee: str) -> tuple[str, list[str], str]:
    """Splits a call into the text before the callee's argument list, its arguments and
    the text after the list."""
    start = text.index(callee + "(") + len(callee) + 1
    depth, args, part = 0, [], start
    for k in range(start, len(text)):
        c = text[k]
        if c in "([{<":
            depth += 1
        elif c in ")]}>" and depth:
            depth -= 1
        elif c == ")" and depth == 0:
            args.append(text[part:k].strip())
            return text[: start - len(callee) - 1], [a for a in args if a], text[k + 1:]
        elif c == "," and depth == 0:
            args.append(text[part:k].strip())
            part = k + 1
    raise IRError(f"unbalanced call: {text[:80]}")


def _rewrite_runtime_calls(function: Function) -> int:
    """Runtime calls the engine provides itself, in place; returns the number of
    threadgroup variable sites."""
    sites = 0
    for block in function.blocks:
        for k, inst in enumerate(block.instructions):
            callee = inst.callee
            if not callee or not callee.startswith("@mtw_") or callee in (
                    _TG_ALLOC, BARRIER, COLLECTIVE):
                continue
            if callee == "@mtw_threadgroup_alloc":
                before, args, after = _call_arguments(inst.text, callee)
                new = (f"{before}{_TG_ALLOC}(ptr %g, ptr %ctx, i32 %i, i32 {sites}, "
                       f"{args[0]}, {args[1]}){after}")
                block.instructions[k] = Instruction(new, inst.result, "call")
                sites += 1
            elif callee == "@mtw_thread_index_in_threadgroup":
                block.instructions[k] = Instruction(f"{inst.result} = add i32 %i, 0",
                                                    inst.result, "add")
            elif callee == "@mtw_kernel_fault":  # the fiber engine reports it
                block.instructions[k] = Instruction("call void @llvm.trap()", None, "call")
            elif callee == "@mtw_log_message":
                # Stays: a message the engine's loops write stops the dispatch, which runs
                # again on fibers (runtime/logging.cpp); with logging off it does nothing.
                continue
            else:
                raise IRError(f"the kernel calls the runtime function {callee[1:]}")
    return sites


def _dispatcher(name: str, calls: list[str], header: str, attributes: str,
                prologue: str = "") -> str:
    """A function running region %r (`calls[r]`: its loop over threads) and returning
    where the threads went."""
    cases = "\n".join(f"    i32 {k}, label %r.{k}" for k in range(len(calls)))
    runs = "\n".join(f"r.{k}:\n  %n.{k} = call i32 {call}\n  ret i32 %n.{k}"
                     for k, call in enumerate(calls))
    return f"""
define internal i32 {name}(i32 %r, {header}) {attributes} {{
entry:
{prologue}  switch i32 %r, label %none [
{cases}
  ]

{runs}

none:
  ret i32 -2
}}
"""


def _iterations(regions: Regions) -> set[int]:
    """The regions that are one iteration of a reduction loop (loops.py): they start at
    the loop's head and can end there again."""
    return {regions.region_after(k) for k, sync in enumerate(regions.syncs)
            if sync.implicit and k in regions.regions[regions.region_after(k)].exits}


def _driver(regions: Regions, sites: int, attributes: str, apart: str,
            independent: set[int]) -> str:
    """The entry the runtime calls for each threadgroup, the dispatcher over the region
    functions and the table of what completes each sync point. With SIMD-group functions,
    each region's loop over a SIMD-group's lanes is a function of its own (attribute group
    `apart`: never inlined), which gets the registers to itself."""
    simd = any(not s.is_barrier for s in regions.syncs)
    implicit = any(s.implicit for s in regions.syncs)
    count = len(regions.regions)
    lanes_loop = ("@mtw_engine_lanes(ptr %g, ptr %buffers, ptr %ctx, ptr %uin, ptr %uout, "
                  "ptr @mtw.region.{k}, i32 %first, i32 %count)")
    if simd:
        loop = lanes_loop
    else:
        loop = ("@mtw_engine_run(ptr %g, ptr %buffers, ptr %ctx, ptr %uin, ptr %uout, "
                f"ptr @mtw.region.{{k}}, ptr {'%next' if implicit else 'null'})")
    loops = [loop.format(k=k).replace("@mtw_engine_run(", "@mtw_engine_run_independent(")
             if k in independent else loop.format(k=k) for k in range(count)]
    header = ("ptr %g, ptr %buffers, ptr %ctx, ptr %uin, ptr %uout, i32 %first, i32 %count")
    lanes = ""
    if simd:
        lanes = "\n".join(
            f"define internal i32 @mtw.lanes.{k}({header}) {apart} {{\n"
            f"  %n = call i32 {loops[k]}\n  ret i32 %n\n}}\n" for k in range(count))
        loops = [f"@mtw.lanes.{k}({header})" for k in range(count)]
    combines = ", ".join(f"ptr {s.combine or 'null'}" for s in regions.syncs)
    table = (f"[{len(regions.syncs)} x ptr] [{combines}]" if regions.syncs
             else "[0 x ptr] zeroinitializer")
    drive = "@mtw_engine_drive_simd" if simd else "@mtw_engine_drive_group"
    arguments = "ptr %g, ptr %buffers, ptr %ctx, ptr %uin, ptr %uout, i64 %uni, ptr @mtw.regions"
    dispatchers = _dispatcher("@mtw.regions", loops, header, attributes,
                              "  %next = getelementptr inbounds %mtw.ctx, ptr %ctx, i64 0, "
                              f"i32 {NEXT}\n" if implicit else "")
    if simd:
        arguments += ", ptr @mtw.combines"
    elif implicit:
        dispatchers += _dispatcher("@mtw.regions.one",
                                   [lanes_loop.format(k=k) for k in range(count)], header,
                                   attributes)
        flags = ", ".join(f"i8 {int(k > 0 and regions.syncs[k - 1].implicit)}"
                          for k in range(count))
        dispatchers += f"\n@mtw.implicit = internal constant [{count} x i8] [{flags}]\n"
        arguments += ", ptr @mtw.regions.one, ptr @mtw.implicit"
    else:
        arguments += ", ptr null, ptr null"
    return f"""{lanes}
@mtw.combines = internal constant {table}

{dispatchers}

define void @mtw_entry_barrier_free(ptr noalias %g, ptr noalias %buffers) {attributes} {{
entry:
  %size.p = getelementptr %mtw.scratch, ptr null, i64 1
  %size = ptrtoint ptr %size.p to i64
  %uni.p = getelementptr %mtw.uni, ptr null, i64 1
  %uni = ptrtoint ptr %uni.p to i64
  %ctx = call ptr @mtw_engine_begin(ptr %g, i64 %size, i32 {sites})
  %uin = getelementptr inbounds %mtw.scratch, ptr %ctx, i64 0, i32 1
  %uout = getelementptr inbounds %mtw.scratch, ptr %ctx, i64 0, i32 2
  call void {drive}({arguments})
  call void @mtw_engine_end(ptr %g)
  ret void
}}"""


_LINKAGE = re.compile(r"^define\s+(?:(?:private|internal|available_externally|linkonce|weak|"
                      r"common|appending|extern_weak|linkonce_odr|weak_odr|external)\s+)?"
                      r"(?:(?:default|hidden|protected)\s+)?(?:dso_local\s+)?"
                      r"(?:dllexport\s+)?")


def _internalized(function: Function) -> Function:
    """`function` with internal linkage, so that it goes once nothing calls it (functions
    clang's back end calls by name, `__*`, stay)."""
    if function.name in _KEPT or function.name.startswith("@__"):
        return function
    header = _LINKAGE.sub("define internal ", function.header, count=1)
    header = re.sub(r"\s+comdat(?:\(\$[^)]*\))?(?=[\s{])", "", header)
    return Function(function.name, header, function.params, function.blocks)


_DECLARATIONS = {"@llvm.trap": "declare void @llvm.trap()"}


def _attributes(header: str) -> str:
    m = re.search(r"\)\s[^(]*?(#\d+)\s*\{\s*$", header)
    if not m:
        raise IRError("the per-thread entry has no attribute group")
    return m.group(1)


def _kept_apart(module_text: str, attributes: str) -> tuple[str, str]:
    """An attribute group like `attributes` (the same target) for functions that are not
    to be inlined, and its definition."""
    m = re.search(rf"^attributes {attributes} = \{{ (.*)\}}$", module_text, re.M)
    if not m:
        raise IRError(f"the module does not define the attribute group {attributes}")
    body = re.sub(r"\b(?:alwaysinline|inlinehint|noinline)\b ?", "", m.group(1))
    number = 1 + max(int(n) for n in re.findall(r"^attributes #(\d+)", module_text, re.M))
    return f"#{number}", f"attributes #{number} = {{ noinline {body}}}"


def _may_diverge(regions: Regions, divergent_blocks: set[str]) -> bool:
    """Whether some threads may leave a region another way than others: a region with two
    ways out (barriers, or a barrier and the return; through implicit syncs, the ways out
    of the regions after them: threads part there and meet again) leaves by one of them
    from a block that only some threads run."""
    function = regions.function.block_map()
    stops = {s.block for s in regions.syncs}
    for region in regions.regions:
        leaving = [b for b in region.blocks if function[b].terminator.opcode == "ret"
                   or set(regions.graph.succ[b]) & stops]
        if len(_ways_out(regions, region.index)) > 1 and set(leaving) & divergent_blocks:
            return True
    return False


def _ways_out(regions: Regions, first: int) -> set[int]:
    """The barriers (and -1, the return) at which threads starting region `first` stop,
    passing implicit syncs."""
    function = regions.function.block_map()
    ways: set[int] = set()
    seen, work = {first}, [first]
    while work:
        region = regions.regions[work.pop()]
        if any(function[b].terminator.opcode == "ret" for b in region.blocks):
            ways.add(-1)
        for k in region.exits:
            after = regions.region_after(k)
            if not regions.syncs[k].implicit:
                ways.add(k)
            elif after not in seen:
                seen.add(after)
                work.append(after)
    return ways


def _check_calls(function: Function, defined: set[str]) -> None:
    """Refuses calls the pass cannot see through: a function clang did not inline (it may
    reach a barrier), or a call through a pointer."""
    for block in function.blocks:
        for inst in block.instructions:
            callee = inst.callee
            if callee is None:
                continue
            if callee.startswith("%"):
                raise IRError("the kernel calls a function through a pointer")
            if callee in defined:
                raise IRError(f"clang did not inline {callee[1:]} into the kernel")


def transform(module_text: str) -> Transformed:
    """The engine's module for `module_text` (see the module docstring); `IRError` says
    why a kernel cannot be run this way."""
    module = parse_module(module_text)
    original = module.functions.get(ENTRY)
    if original is None:
        raise IRError(f"the module has no {ENTRY[1:]}")
    function = canonical(original)
    _check_calls(function, set(module.functions))
    if set(module.type_names()) & function.values():
        raise IRError("a value is named like a type")
    sites = _rewrite_runtime_calls(function)
    run_lane_by_lane(function)
    mark_reduction_loops(function)
    regions = form_regions(function)
    regions.named_types = named_types(module_text)
    liveness = Liveness.of(regions.function, regions.graph)
    roots = ("%g", "%buffers")
    uniformity = analyse(regions.function, regions.graph, ("%i", "%x", "%y", "%z"), roots,
                         frozenset({_TG_ALLOC}))
    decided = plan(regions, liveness, uniformity, invariant_loads(regions.function, roots))
    layout = Layout.of(decided, sites)
    attributes = _attributes(original.header)
    independent = _iterations(regions)
    texts = [region_function(decided, layout, r, attributes, r.index in independent)
             for r in regions.regions]
    pieces: list[str | Function] = []
    for piece in module.pieces:
        if isinstance(piece, Function):
            if piece.name != ENTRY:
                pieces.append(_internalized(piece))
        else:
            pieces.append(piece if pieces else piece + "\n" + layout.type_definitions())
    pieces += texts
    apart = ""
    if any(not s.is_barrier for s in regions.syncs):
        apart, apart_definition = _kept_apart(module_text, attributes)
        pieces.append(apart_definition)
    pieces.append(_driver(regions, sites, attributes, apart, independent))
    may_diverge = _may_diverge(regions, uniformity.divergent_blocks)
    pieces.append(f"@mtw_engine_may_diverge = constant i32 {int(may_diverge)}")
    text = Module(pieces).text()
    for name, declaration in _DECLARATIONS.items():
        if not re.search(rf"^(?:declare|define)\b[^\n]*{re.escape(name)}\(", text, re.M):
            text += declaration + "\n"
    kept: dict[str, int] = {}
    for values in decided.stored_at:
        for v in values:
            kept[decided.kinds[v].value] = kept.get(decided.kinds[v].value, 0) + 1
    return Transformed(text, len(regions.syncs), len(regions.regions), kept, may_diverge)
