"""Instruction-level parallelism of a kernel's code, from its optimised IR: how many
independent instructions a thread has to issue per step of its longest dependency chain.

An Apple GPU's SIMD-group issues in order, and a dependent ALU instruction waits for its
operand (metal-benchmarks: ~6 cycles for FFMA32); a thread that keeps several independent
chains (several accumulators) lets its SIMD-group issue back-to-back, so fewer SIMD-groups
hide the latency. The analysis:

- **Work and latency.** The instructions that count as GPU work (`latency` says which:
  instrument.py's counting, one per lane operation, SIMD-group function or inlined math
  function) take one step; everything else (addresses, loads, the emulator's plumbing)
  takes none. A private array (an `alloca`) is one value in memory: a load waits for the
  stores before it.
- **Loops.** A loop whose trip count is a constant (template constants, as in
  ``for (int i = 0; i < PerLane; ++i)``) is taken as unrolled, as Apple's compiler does
  with such loops: its iterations overlap as far as their carried dependencies allow (the
  loop's phis, and private arrays it reads before writing at addresses that do not move
  with the iteration). A loop with any other trip count runs its iterations one after
  another; each iteration's chain is the critical path.
- **Regions.** Each loop of the second kind, and the code outside all of them, is a
  region: its ILP is its work (operations, constant loops times their trip counts) over
  its critical path, at least 1. Every block takes its region's ILP.

`chains()` gives each block its share of the critical path per execution (operations /
the region's ILP), so that the runtime's execution counts weight it: the profiler sums
them as `Counters.dependent_issues`. `load_chains()` does the same over loads of memory
(each load one step, everything else none: a load waits only for the loads its address
or its ordering after a private store needs): `Counters.dependent_loads`, and so the
loads a SIMD-group has in flight at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .ir_loops import EDGE, Graph, Loop
from .llvm_ir import Function, Instruction

__all__ = ["chains", "load_chains"]

_SIMULATED = 64  # iterations of a constant loop simulated; beyond, extrapolated linearly
_PTR = re.compile(r"ptr (%[-\w.$]+)")
_IGNORED_CALLS = ("llvm.lifetime.", "llvm.dbg.", "__sanitizer_", "mtw_profile_")


def _ignored(ins: Instruction) -> bool:
    """Calls that are not the kernel's: markers, and the emulator's own hooks."""
    return ins.opcode == "call" and (ins.callee or "").startswith(_IGNORED_CALLS)


# --- critical paths -----------------------------------------------------------------------


class _Timing:
    """Earliest finishing step of each value, relative to the start of a region."""

    def __init__(self, g: Graph, latency: Callable[[Instruction], int]):
        self.g, self.latency = g, latency
        self.allocas = {ins.result for b in g.blocks.values() for ins in b.instructions
                        if ins.opcode == "alloca" and ins.result}
        self.base: dict[str, str | None] = {}
        self.lengths: dict[str, int] = {}  # header -> whole length of a constant loop

    def root(self, pointer: str) -> str | None:
        """The private array a pointer points into, or None."""
        if pointer not in self.base:
            ins = self.g.by_name.get(pointer)
            if pointer in self.allocas:
                self.base[pointer] = pointer
            elif ins is not None and ins.opcode in ("getelementptr", "bitcast") and ins.uses:
                self.base[pointer] = self.root(ins.uses[0])
            else:
                self.base[pointer] = None
        return self.base[pointer]

    def arrays(self, ins: Instruction) -> list[str]:
        """The private arrays a load, store or call accesses."""
        if ins.opcode not in ("load", "store", "call") or _ignored(ins):
            return []
        return [a for a in (self.root(p) for p in _PTR.findall(ins.text)) if a]

    def step(self, ins: Instruction, time: dict[str, int], memory: dict[str, int]) -> None:
        """Times `ins`'s result and the private arrays it writes."""
        if _ignored(ins):
            return
        ready = max((time.get(u, 0) for u in ins.uses), default=0)
        arrays = self.arrays(ins)
        if ins.opcode in ("load", "call"):
            ready = max([ready, *(memory.get(a, 0) for a in arrays)])
        done = ready + self.latency(ins)
        if ins.result:
            time[ins.result] = done
        if ins.opcode in ("store", "call"):
            for a in arrays:
                memory[a] = max(memory.get(a, 0), done)

    def body(self, loop: Loop | None, blocks: Sequence[str], time: dict[str, int],
             memory: dict[str, int]) -> None:
        """Times one pass over `blocks` (in order; `loop`'s header phis are timed by the
        caller), the loops directly inside as one node each."""
        inner = {b: m for m in (loop.inner if loop else self.g.loops) for b in m.blocks}
        header = loop.header if loop else None
        done: set[int] = set()
        for label in blocks:
            m = inner.get(label)
            if m is None:
                for ins in self.g.blocks[label].instructions:
                    if not (label == header and ins.opcode == "phi"):
                        self.step(ins, time, memory)
            elif id(m) not in done:
                done.add(id(m))
                self._collapsed(m, time, memory)

    def _collapsed(self, m: Loop, time: dict[str, int], memory: dict[str, int]) -> None:
        """A constant loop as one node: it starts when its inputs are ready, and its
        values and the arrays it writes are ready its whole length later."""
        instructions = [i for b in m.blocks for i in self.g.blocks[b].instructions]
        inside = {i.result for i in instructions if i.result}
        arrays = {a for i in instructions for a in self.arrays(i)}
        start = max([0, *(time.get(u, 0) for i in instructions for u in i.uses
                          if u not in inside), *(memory.get(a, 0) for a in arrays)])
        end = start + self.length(m)
        for name in inside:
            time[name] = end
        for a in arrays:
            if any(i.opcode in ("store", "call") and a in self.arrays(i) for i in instructions):
                memory[a] = max(memory.get(a, 0), end)

    def length(self, m: Loop) -> int:
        """The critical path of all of a constant loop's iterations, overlapped."""
        if m.header not in self.lengths:
            self.lengths[m.header] = self._simulate(m)
        return self.lengths[m.header]

    def _simulate(self, m: Loop) -> int:
        blocks = [b for b in self.g.order if b in m.blocks]
        phis = [i for i in self.g.blocks[m.header].instructions if i.opcode == "phi"]
        carried = self._carried_arrays(m, blocks)
        time: dict[str, int] = {}
        memory: dict[str, int] = {}
        ends: list[int] = []
        trips = m.trips or 1
        for _ in range(min(trips, _SIMULATED)):
            time = {p.result: self._back_edge_time(p, m, time) for p in phis if p.result}
            memory = {a: t for a, t in memory.items() if a in carried}
            self.body(m, blocks, time, memory)
            ends.append(max([0, *time.values(), *memory.values()]))
        if trips > len(ends):  # the last iteration's growth goes on
            grown = ends[-1] - ends[-2] if len(ends) > 1 else ends[-1]
            return ends[-1] + grown * (trips - len(ends))
        return ends[-1]

    def _back_edge_time(self, phi: Instruction, m: Loop, time: dict[str, int]) -> int:
        return max([0, *(time.get(v.strip(), 0) for v, pred in EDGE.findall(phi.operands)
                         if pred in m.blocks)])

    def _carried_arrays(self, m: Loop, blocks: Sequence[str]) -> set[str]:
        """Private arrays an iteration reads before writing, at addresses that do not move
        with the iteration: what an iteration leaves in them, the next one reads."""
        moving = self._moving(m)
        first: dict[str, str] = {}
        fixed: set[str] = set()
        for label in blocks:
            for ins in self.g.blocks[label].instructions:
                for p in _PTR.findall(ins.text) if self.arrays(ins) else ():
                    a = self.root(p)
                    if a is None:
                        continue
                    first.setdefault(a, "read" if ins.opcode in ("load", "call") else "write")
                    if p not in moving:
                        fixed.add(a)
        return {a for a, kind in first.items() if kind == "read" and a in fixed}

    def _moving(self, m: Loop) -> set[str]:
        """Values that change from one iteration of `m` to the next: its header's phis
        and whatever is computed from them."""
        users: dict[str, list[Instruction]] = {}
        for b in m.blocks:
            for ins in self.g.blocks[b].instructions:
                for u in ins.uses:
                    users.setdefault(u, []).append(ins)
        work = [i.result for i in self.g.blocks[m.header].instructions
                if i.opcode == "phi" and i.result]
        moving = set(work)
        while work:
            for ins in users.get(work.pop(), ()):
                if ins.result and ins.result not in moving:
                    moving.add(ins.result)
                    work.append(ins.result)
        return moving


def _regions(loops: list[Loop], outside: set[str]) -> list[tuple[Loop, set[str]]]:
    """(loop, its own blocks) of the regions among `loops` and inside them: a loop that
    is not constant and its blocks outside the regions within it. Their blocks are taken
    out of `outside`, the blocks of the region around them."""
    out: list[tuple[Loop, set[str]]] = []
    for lp in loops:
        if lp.constant:
            continue
        own = set(lp.blocks)
        out += _regions(lp.inner, own)
        out.append((lp, own))
        outside -= lp.blocks
    return out


def _multiplicities(loops: list[Loop], outer: int = 1) -> dict[str, int]:
    """Executions of each block per pass over its region: the trip counts of the constant
    loops around it."""
    out: dict[str, int] = {}
    for lp in loops:
        factor = outer * (lp.trips or 1) if lp.constant else 1
        for b in lp.blocks:
            out[b] = factor
        out.update(_multiplicities(lp.inner, factor))
    return out


def chains(f: Function, ops: Sequence[int], latency: Callable[[Instruction], int]
           ) -> list[float]:
    """Each block's share of the critical path per execution: its operations (`ops`, by
    block of `f`) over its region's ILP. `latency(ins)` is 1 for an instruction that is
    GPU work, else 0."""
    g = Graph(f)
    return _shares(f, g, _Timing(g, latency), ops)


def load_chains(f: Function, counted: Callable[[Instruction], bool]
                ) -> tuple[list[int], list[float]]:
    """Memory-level parallelism, measured as ILP is but over loads: per block of `f`, the
    loads of memory one execution issues (the loads `counted` names, of anything but the
    thread's private arrays), and their share of the chain of dependent loads (each load
    one step, everything else none): a region's loads over that chain's length are the
    loads a lane has in flight at once."""
    g = Graph(f)
    probe = _Timing(g, lambda ins: 0)
    loads = {id(ins) for block in f.blocks for ins in block.instructions
             if ins.opcode == "load" and counted(ins) and not probe.arrays(ins)}
    per_block = [sum(id(ins) in loads for ins in block.instructions) for block in f.blocks]
    timing = _Timing(g, lambda ins: int(id(ins) in loads))
    return per_block, _shares(f, g, timing, per_block)


def _shares(f: Function, g: Graph, timing: _Timing, ops: Sequence[int]) -> list[float]:
    top = set(g.order)
    regions: list[tuple[Loop | None, set[str]]] = [*_regions(g.loops, top), (None, top)]
    index = {b.label: i for i, b in enumerate(f.blocks)}
    multiplicity = _multiplicities(g.loops)
    out = [float(n) for n in ops]
    for loop, blocks in regions:
        ordered = [b for b in g.order if b in blocks]
        time: dict[str, int] = {}
        timing.body(loop, ordered, time, {})
        path = max([0, *time.values()])
        work = sum(ops[index[b]] * multiplicity.get(b, 1) for b in blocks)
        ilp = max(1.0, work / path) if path else 1.0
        for b in blocks:
            out[index[b]] = ops[index[b]] / ilp
    return out
