"""Which of a thread's private arrays and structs (`alloca`s) need no context slot.

An alloca's memory must outlive a barrier unless, at that barrier, it is outside its
lifetime (between `llvm.lifetime.end` and the next `llvm.lifetime.start`, or before the
first start), or no pointer into it is live there and its address never escaped into
memory or a call. An alloca whose memory is dead at every barrier gets a fresh copy in
each region that uses it; every other one gets a slot per thread in the context.
"""

from __future__ import annotations

from .cfg import Liveness
from .ir import Instruction, IRError
from .regions import Regions

__all__ = ["private_allocas"]

_DERIVING = frozenset({"getelementptr", "bitcast", "addrspacecast", "select", "phi"})
_HARMLESS_CALLS = ("@llvm.lifetime.", "@llvm.memcpy.", "@llvm.memmove.", "@llvm.memset.",
                   "@llvm.assume", "@llvm.experimental.noalias.scope.decl",
                   "@mtw_engine_lane_collective")


def _derived(regions: Regions, allocas: list[str]) -> dict[str, set[str]]:
    """For each alloca, the values that may point into it."""
    out = {a: {a} for a in allocas}
    insts = [i for b in regions.function.blocks for i in b.instructions]
    changed = True
    while changed:
        changed = False
        for inst in insts:
            if inst.opcode not in _DERIVING or not inst.result:
                continue
            operands = set(inst.operands())
            for pointers in out.values():
                if inst.result not in pointers and operands & pointers:
                    pointers.add(inst.result)
                    changed = True
    return out


def _escapes(inst: Instruction, pointers: set[str]) -> bool:
    """Whether `inst` lets an address in `pointers` out (into memory or a call)."""
    operands = inst.operands()
    if not set(operands) & pointers or inst.opcode in _DERIVING:
        return False
    if inst.opcode in ("load", "icmp"):
        return False
    if inst.opcode == "store":  # `store T value, ptr address`: the address is last
        return bool(set(operands[:-1]) & pointers)
    if inst.opcode == "call":
        return not (inst.callee or "").startswith(_HARMLESS_CALLS)
    return True


def _lifetimes(regions: Regions, marked: set[str]) -> dict[str, set[str]]:
    """Per block, the marked allocas that may be inside their lifetime at its start."""
    function, graph = regions.function, regions.graph
    blocks = function.block_map()
    state: dict[str, set[str]] = {b: set() for b in graph.order}
    changed = True
    while changed:
        changed = False
        for name in graph.order:
            live = set(state[name])
            for inst in blocks[name].instructions:
                callee = inst.callee or ""
                if callee.startswith("@llvm.lifetime.start"):
                    live |= set(inst.operands()) & marked
                elif callee.startswith("@llvm.lifetime.end"):
                    live -= set(inst.operands())
            for s in graph.succ[name]:
                if not live <= state[s]:
                    state[s] |= live
                    changed = True
    return state


def private_allocas(regions: Regions, liveness: Liveness) -> set[str]:
    """The allocas whose memory is dead at every barrier."""
    function = regions.function
    allocas = []
    for k, block in enumerate(function.blocks):
        for inst in block.instructions:
            if inst.opcode == "alloca":
                if k:
                    raise IRError("an alloca outside the entry block (a variable-length "
                                  "array?)")
                allocas.append(inst.result)
    derived = _derived(regions, allocas)
    insts = [i for b in function.blocks for i in b.instructions]
    marked = {o for i in insts if (i.callee or "").startswith("@llvm.lifetime.")
              for o in i.operands()}
    in_lifetime = _lifetimes(regions, marked)
    private = set()
    for alloca in allocas:
        pointers = derived[alloca]
        escaped = any(_escapes(i, pointers) for i in insts)
        dead_everywhere = True
        for sync in regions.syncs:
            if alloca in marked and alloca not in in_lifetime[sync.block]:
                continue  # outside its lifetime here
            if escaped or pointers & liveness.live_in[sync.block]:
                dead_everywhere = False
                break
        if dead_everywhere:
            private.add(alloca)
    return private
