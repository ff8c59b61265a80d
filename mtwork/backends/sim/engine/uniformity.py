"""Which values are the same in every thread of a threadgroup (uniform), and which may
differ (divergent).

A value is divergent when it depends on the thread's index (data dependence) or on which
way a divergent branch went (sync dependence): a phi in a block that paths leaving a
divergent branch reach before they meet again at the branch's immediate post-dominator,
or at it, merges values of different threads (the rule of Karrenberg and Hack's
whole-function vectorization, taken conservatively: every block between the branch and
its post-dominator counts as a join). Loads are divergent except from the launcher's
buffer table and threadgroup record, which no kernel writes; calls are divergent except
pure math on uniform arguments and threadgroup variables, whose addresses the engine
checks at run time to be the same in every thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .cfg import Graph
from .ir import Function, Instruction

__all__ = ["Uniformity", "analyse", "invariant_loads"]

_PURE_INTRINSIC = re.compile(
    r"@llvm\.(?:fabs|sqrt|fma|fmuladd|copysign|floor|ceil|trunc|rint|nearbyint|round|"
    r"roundeven|minnum|maxnum|minimum|maximum|minimumnum|maximumnum|exp|exp2|exp10|log|"
    r"log2|log10|pow|powi|sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|ldexp|frexp|"
    r"smax|smin|umax|umin|abs|ctpop|ctlz|cttz|bitreverse|bswap|fshl|fshr|is\.fpclass|"
    r"[su](?:add|sub|mul)\.with\.overflow|[su](?:add|sub|shl)\.sat|lround|llround|"
    r"lrint|llrint|vector\.reduce\.\w+|experimental\.constrained\.\w+)\b")
_LIBM = re.compile(r"@(?:exp|exp2|expm1|log|log2|log10|log1p|sin|cos|tan|asin|acos|atan|"
                   r"atan2|sinh|cosh|tanh|asinh|acosh|atanh|pow|sqrt|cbrt|hypot|fmod|"
                   r"remainder|erf|erfc|tgamma|lgamma|ldexp|frexp|modf|nextafter|"
                   r"fdim|fmax|fmin)f?$")
_DATA_OPS = frozenset({
    "add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr", "and", "or",
    "xor", "fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "freeze", "icmp", "fcmp", "select",
    "trunc", "zext", "sext", "fptrunc", "fpext", "fptoui", "fptosi", "uitofp", "sitofp",
    "ptrtoint", "inttoptr", "bitcast", "addrspacecast", "getelementptr", "extractvalue",
    "insertvalue", "extractelement", "insertelement", "shufflevector", "phi"})


@dataclass
class Uniformity:
    divergent: set[str]  # divergent values
    divergent_branches: set[str]  # blocks ending in a branch on a divergent value
    divergent_blocks: set[str]  # blocks only some threads may run

    def uniform(self, value: str) -> bool:
        return value not in self.divergent


def _is_pure_call(inst: Instruction) -> bool:
    callee = inst.callee or ""
    return bool(_PURE_INTRINSIC.match(callee) or _LIBM.match(callee))


def _seed(inst: Instruction, invariant_bases: set[str], uniform_calls: frozenset[str]) -> bool:
    """Whether `inst` makes a divergent value whatever its operands are."""
    if inst.opcode == "load":
        pointer = inst.operands()[-1] if inst.operands() else ""
        return pointer not in invariant_bases
    if inst.opcode == "call":
        return not (_is_pure_call(inst) or inst.callee in uniform_calls)
    return inst.opcode not in _DATA_OPS


def _invariant_bases(function: Function, roots: tuple[str, ...]) -> set[str]:
    """`roots` and the addresses computed from them by getelementptr with constant
    indices: the memory loads from them read is never written by a kernel."""
    bases = set(roots)
    changed = True
    while changed:
        changed = False
        for block in function.blocks:
            for inst in block.instructions:
                if (inst.opcode == "getelementptr" and inst.result not in bases
                        and inst.operands() and inst.operands()[0] in bases
                        and len(inst.operands()) == 1):
                    bases.add(inst.result)
                    changed = True
    return bases


def invariant_loads(function: Function, roots: tuple[str, ...]) -> set[str]:
    """The loads of `function` from memory no kernel writes (see `_invariant_bases`)."""
    bases = _invariant_bases(function, roots)
    return {i.result for b in function.blocks for i in b.instructions
            if i.opcode == "load" and i.result and i.operands()
            and i.operands()[-1] in bases}


def analyse(function: Function, graph: Graph, thread_values: tuple[str, ...],
            invariant_roots: tuple[str, ...], uniform_calls: frozenset[str]) -> Uniformity:
    """Divergence of every value of `function`, whose parameters `thread_values` differ
    per thread and whose parameters `invariant_roots` point at memory no kernel writes;
    calls to `uniform_calls` give the same result in every thread."""
    invariant = _invariant_bases(function, invariant_roots)
    ipdom = graph.immediate_postdominators()
    divergent = set(thread_values)
    for block in function.blocks:
        for inst in block.instructions:
            if inst.result and _seed(inst, invariant, uniform_calls):
                divergent.add(inst.result)
    branches: set[str] = set()
    joins: set[str] = set()
    changed = True
    while changed:
        changed = False
        for block in function.blocks:
            if block.name not in branches and _branches_on(block.terminator, divergent):
                branches.add(block.name)
                stop = ipdom[block.name]
                region = graph.reachable(graph.succ[block.name],
                                         frozenset({stop}) if stop else frozenset())
                joins.update(region)
                if stop:
                    joins.add(stop)
                changed = True
            for inst in block.instructions:
                if not inst.result or inst.result in divergent or inst.callee in uniform_calls:
                    continue
                if (inst.opcode == "phi" and block.name in joins) or any(
                        v in divergent for v in inst.operands()):
                    divergent.add(inst.result)
                    changed = True
    inside = set()
    for name in branches:
        stop = ipdom[name]
        inside.update(graph.reachable(graph.succ[name], frozenset({stop}) if stop else
                                      frozenset()))
    return Uniformity(divergent, branches, inside)


def _branches_on(terminator: Instruction, divergent: set[str]) -> bool:
    """Whether a branch or switch goes one way or another by a divergent value (its
    other operands are blocks, never divergent)."""
    return terminator.opcode in ("br", "switch") and any(
        v in divergent for v in terminator.operands())
