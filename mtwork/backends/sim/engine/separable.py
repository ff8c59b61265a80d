"""SIMD-group functions that need not be sync points: loads of `simdgroup_matrix` tiles.

A lane's part of a `simdgroup_load` reads its own two elements; the lanes only meet so
that the load sees what every lane wrote just before it and that no lane writes before
every lane has read (the group moves in lockstep on the GPU). Where no lane writes
memory another lane could read between the sync points before and after the load (only
the thread's own arrays and structs), running it lane by lane, as the engine runs the
code between sync points, reads the same values. Each such call becomes a call of
`mtw_engine_lane_collective` (include/mtw_engine.h), which runs the combine function for
the one lane, and stops being a sync point: the regions on both sides of it merge.
"""

from __future__ import annotations

import re

from .cfg import Graph
from .ir import Function, Instruction
from .regions import BARRIER, COLLECTIVE

__all__ = ["LANE_COLLECTIVE", "run_lane_by_lane"]

LANE_COLLECTIVE = "@mtw_engine_lane_collective"
# include/mtw_simdgroup_matrix.h: mtw_sgmatrix::load<T>, the combine of simdgroup_load.
_SEPARABLE = re.compile(r"@_ZN12mtw_sgmatrix4loadI")
_DERIVING = frozenset({"getelementptr", "bitcast", "addrspacecast", "select", "phi"})
_WRITES = frozenset({"store", "atomicrmw", "cmpxchg", "fence"})
# Calls that write no memory but what their pointer arguments point at (and then only
# memcpy, memmove and memset, through their first argument), or nothing.
_QUIET_CALLS = re.compile(r"@llvm\.(?:lifetime\.|assume|experimental\.noalias|fabs|sqrt|fma|"
                          r"fmuladd|copysign|floor|ceil|trunc|rint|round|minnum|maxnum|"
                          r"minimum|maximum|smax|smin|umax|umin|abs|ctpop|ctlz|cttz|"
                          r"vector\.reduce\.)|@mtw_engine_tg_alloc$")
_MEMORY_CALLS = re.compile(r"@llvm\.(?:memcpy|memmove|memset)\.")


def _private_pointers(function: Function) -> set[str]:
    """Values that point into the thread's own allocas only: allocas, and addresses
    derived from them (phis and selects of such addresses, taken optimistically round
    loops, then pruned until every one holds)."""
    insts = [i for b in function.blocks for i in b.instructions if i.result]
    private = {i.result for i in insts if i.opcode in ("alloca", *_DERIVING)}
    defined = {i.result for i in insts} | set(function.params)
    changed = True
    while changed:
        changed = False
        for inst in insts:
            if inst.result not in private or inst.opcode == "alloca":
                continue
            values = [v for v in inst.operands() if v in defined]
            if inst.opcode == "select":
                values = values[1:]  # the condition is no address
            elif inst.opcode != "phi":
                values = values[:1]  # the base; indices are no addresses
            if not values or not all(v in private for v in values):
                private.discard(inst.result)  # type: ignore[arg-type]
                changed = True
    return private  # type: ignore[return-value]


def _writes_shared(inst: Instruction, private: set[str]) -> bool:
    """Whether `inst` may write memory other than the thread's own allocas."""
    operands = inst.operands()
    if inst.opcode in _WRITES:
        return inst.opcode != "store" or not operands or operands[-1] not in private
    if inst.opcode != "call":
        return False
    callee = inst.callee or ""
    if _QUIET_CALLS.match(callee):
        return False
    if _MEMORY_CALLS.match(callee):
        return not operands or operands[0] not in private
    return True


def _is_sync(inst: Instruction) -> bool:
    return inst.callee in (BARRIER, COLLECTIVE)


def _quiet_around(function: Function, graph: Graph, block: str, index: int,
                  private: set[str]) -> bool:
    """Whether no shared memory is written between the sync points that reach, or are
    reached from, instruction `index` of `block` without passing another."""
    blocks = function.block_map()
    forward: set[str] = set()
    backward: set[str] = set()
    # (block, first, step): scan from `first` in direction `step` until a sync point.
    work = [(block, index + 1, 1), (block, index - 1, -1)]
    while work:
        name, k, step = work.pop()
        insts = blocks[name].instructions
        stopped = False
        while 0 <= k < len(insts):
            if _is_sync(insts[k]):
                stopped = True
                break
            if _writes_shared(insts[k], private):
                return False
            k += step
        if stopped:
            continue
        nexts, seen = (graph.succ[name], forward) if step > 0 else (graph.pred[name], backward)
        for n in nexts:
            if n not in seen:
                seen.add(n)
                work.append((n, 0 if step > 0 else len(blocks[n].instructions) - 1, step))
    return True


def _arguments(inst: Instruction) -> tuple[str, str, str] | None:
    m = re.search(rf"{COLLECTIVE}\(ptr[^,]*? (%[-\w.]+), ptr[^,]*? (%[-\w.]+), "
                  r"ptr[^,]*? (@[-\w.$]+)\)", inst.text)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def run_lane_by_lane(function: Function) -> int:
    """Turns the separable SIMD-group functions of `function` that are safe to run lane
    by lane into calls of LANE_COLLECTIVE, in place; returns how many."""
    graph = Graph.of(function)
    private = _private_pointers(function)
    chosen: list[tuple[str, int, tuple[str, str, str]]] = []
    for block in function.blocks:
        for k, inst in enumerate(block.instructions):
            if inst.callee != COLLECTIVE:
                continue
            args = _arguments(inst)
            if (args and _SEPARABLE.match(args[2]) and args[0] in private
                    and args[1] in private
                    and _quiet_around(function, graph, block.name, k, private)):
                chosen.append((block.name, k, args))
    blocks = function.block_map()
    for name, k, (arg_in, arg_out, combine) in chosen:
        text = (f"call void {LANE_COLLECTIVE}(ptr {arg_in}, ptr {arg_out}, ptr {combine}, "
                "i32 %i)")
        blocks[name].instructions[k] = Instruction(text, None, "call")
    return len(chosen)
