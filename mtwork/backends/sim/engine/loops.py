"""Implicit syncs at the head and the exits of a thread's reduction loops, so that each
iteration of such a loop is a region of its own and the loop over threads comes inside.

A loop between two barriers runs, in the engine, inside the loop over the group's
threads: each thread runs all its iterations before the next thread starts. The loop
vectorizer works on innermost loops, so it takes the thread's own loop, and a loop that
carries a floating-point value (`m = max(m, x[j])`, `s += exp(x[j] - m)`) is a reduction
it may not reorder (no fast-math reassociation): it stays scalar, and so does every
`exp` in it. Cut at its head and its exits, the loop runs an iteration at a time for
all threads, each thread's running values in its own slots of the context; the loop
over threads is then innermost and vectorizes. PoCL's kernel compiler adds implicit
barriers to loops for the same reason (its ImplicitLoopBarriers pass).

An implicit sync is no barrier, so the trip count need not be the same in every thread:
where threads leave a region at different sync points and some of those are implicit,
the driver runs each thread on by itself until it reaches a real barrier or returns
(include/mtw_engine.h, `mtw_engine_settle`). Each thread runs the same operations in the
same order as before; only the order between threads within a barrier interval changes,
and for that to be invisible the loop only reads memory: no store, atomic, fence or
call other than an intrinsic. Kernels with SIMD-group functions are left as they are
(their driver runs each SIMD-group on to its next meeting, with no per-thread way on),
and so are loops with fewer than MIN_FLOAT_OPS floating-point operations an iteration.
"""

from __future__ import annotations

import re

from .cfg import Graph
from .ir import Function, Instruction
from .regions import COLLECTIVE, LOOP_SYNC

__all__ = ["mark_reduction_loops"]

_FLOATING = re.compile(r"^\S+ = phi (?:<\d+ x )?(?:half|bfloat|float|double)\b")
_SIDE_EFFECTS = frozenset({"store", "atomicrmw", "cmpxchg", "fence", "invoke", "callbr"})
_FLOAT_OPS = frozenset({"fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "fcmp", "fptrunc",
                        "fpext", "fptoui", "fptosi", "uitofp", "sitofp"})
_FLOAT_CALL = re.compile(r"^@llvm\.(?:fma|fmuladd|exp|exp2|log|log2|sqrt|pow|sin|cos)\.")
# Floating-point operations an iteration must have for the cut to pay: each iteration
# loads and stores, per thread, every value live across the loop's head in the context.
# Measured (docs/records/emulator-performance.md): a tiled GEMM's inner product, a multiply
# and an add per iteration, ran 3 times slower cut; a NaN-aware `max` (four comparisons)
# and an `exp` (about 25 operations) ran faster.
MIN_FLOAT_OPS = 3


def _back_edges(graph: Graph) -> list[tuple[str, str]]:
    """Edges (latch, header) to a block still being visited by a depth-first walk."""
    entry = graph.order[0]
    edges, on_path, seen = [], {entry}, {entry}
    stack = [(entry, iter(graph.succ[entry]))]
    while stack:
        node, successors = stack[-1]
        nxt = next(successors, None)
        if nxt is None:
            on_path.discard(node)
            stack.pop()
        elif nxt in on_path:
            edges.append((node, nxt))
        elif nxt not in seen:
            seen.add(nxt)
            on_path.add(nxt)
            stack.append((nxt, iter(graph.succ[nxt])))
    return edges


def _natural_loops(graph: Graph) -> dict[str, set[str]]:
    """Each loop's header and blocks: the header and those that reach one of its latches
    without passing the header."""
    loops: dict[str, set[str]] = {}
    for latch, header in _back_edges(graph):
        body = loops.setdefault(header, {header})
        work = [latch] if latch not in body else []
        body.add(latch)
        while work:
            for p in graph.pred[work.pop()]:
                if p not in body:
                    body.add(p)
                    work.append(p)
    return loops


def _float_ops(function: Function, blocks: set[str]) -> int:
    return sum(1 for block in function.blocks if block.name in blocks
               for inst in block.instructions
               if inst.opcode in _FLOAT_OPS or _FLOAT_CALL.match(inst.callee or ""))


def _only_reads(function: Function, blocks: set[str]) -> bool:
    """Whether the loop of `blocks` has no store, atomic, fence, volatile access or call
    other than an intrinsic (so no barrier either)."""
    for block in function.blocks:
        if block.name not in blocks:
            continue
        for inst in block.instructions:
            if inst.opcode in _SIDE_EFFECTS or " volatile " in inst.text:
                return False
            callee = inst.callee
            if callee is not None and not callee.startswith("@llvm."):
                return False
    return True


def mark_reduction_loops(function: Function) -> int:
    """Puts a call of LOOP_SYNC after the phis of the head and of the exits of every
    innermost loop of `function` that carries a floating-point value and only reads (see
    the module docstring): each iteration is then a region of its own, with nothing but
    the loop in it. Returns how many loops it marked."""
    calls = {inst.callee for block in function.blocks for inst in block.instructions}
    if COLLECTIVE in calls:
        return 0
    graph = Graph.of(function)
    loops = _natural_loops(graph)
    blocks = function.block_map()
    marked = 0
    for header, body in loops.items():
        innermost = not any(h in body for h in loops if h != header)
        if not innermost or not any(_FLOATING.match(p.text) for p in blocks[header].phis):
            continue
        if not _only_reads(function, body) or _float_ops(function, body) < MIN_FLOAT_OPS:
            continue
        exits = {s for b in body for s in graph.succ[b] if s not in body}
        for name in (header, *sorted(exits, key=graph.order.index)):
            block = blocks[name]
            block.instructions.insert(len(block.phis),
                                      Instruction(f"call void {LOOP_SYNC}()", None, "call"))
        marked += 1
    return marked
