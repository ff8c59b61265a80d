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
them as `Counters.dependent_issues`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .llvm_ir import Function, Instruction

__all__ = ["chains"]

_SIMULATED = 64  # iterations of a constant loop simulated; beyond, extrapolated linearly
_LONGEST_TRIP = 1 << 16  # longest constant trip count looked for
_PTR = re.compile(r"ptr (%[-\w.$]+)")
_INT = re.compile(r"-?\d+")
_EDGE = re.compile(r"\[\s*([^,\]]+),\s*(%[-\w.$]+)\s*\]")  # a phi's [value, block]
_IGNORED_CALLS = ("llvm.lifetime.", "llvm.dbg.", "__sanitizer_", "mtw_profile_")


def _ignored(ins: Instruction) -> bool:
    """Calls that are not the kernel's: markers, and the emulator's own hooks."""
    return ins.opcode == "call" and (ins.callee or "").startswith(_IGNORED_CALLS)


@dataclass
class _Loop:
    header: str
    blocks: set[str]
    inner: list[_Loop] = field(default_factory=list)
    trips: int | None = None  # constant trip count, or None

    @property
    def constant(self) -> bool:
        return self.trips is not None and all(m.constant for m in self.inner)


class _Graph:
    """The function's blocks, their order, dominators and loops."""

    def __init__(self, f: Function):
        self.blocks = {b.label: b for b in f.blocks}
        self.succ = {b.label: [s for s in b.successors() if s in self.blocks] for b in f.blocks}
        self.order = self._reverse_postorder(f.blocks[0].label)
        self.rank = {label: i for i, label in enumerate(self.order)}
        self.defined = {ins.result: b.label for b in f.blocks for ins in b.instructions
                        if ins.result}
        self.by_name = {ins.result: ins for b in f.blocks for ins in b.instructions
                        if ins.result}
        self.loops = self._loops(self._dominators())

    def _reverse_postorder(self, entry: str) -> list[str]:
        seen, post, stack = {entry}, [], [(entry, iter(self.succ[entry]))]
        while stack:
            label, it = stack[-1]
            nxt = next((s for s in it if s not in seen), None)
            if nxt is None:
                post.append(label)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(self.succ[nxt])))
        return post[::-1]

    def _dominators(self) -> dict[str, set[str]]:
        pred: dict[str, list[str]] = {b: [] for b in self.order}
        for b in self.order:
            for s in self.succ[b]:
                if s in pred:
                    pred[s].append(b)
        every = set(self.order)
        dom = {b: set(every) for b in self.order}
        dom[self.order[0]] = {self.order[0]}
        changed = True
        while changed:
            changed = False
            for b in self.order[1:]:
                new = {b} | set.intersection(*(dom[p] for p in pred[b])) if pred[b] else {b}
                if new != dom[b]:
                    dom[b], changed = new, True
        self.pred = pred
        return dom

    def _loops(self, dom: dict[str, set[str]]) -> list[_Loop]:
        """The outermost natural loops, each with its inner ones."""
        bodies: dict[str, set[str]] = {}
        for u in self.order:
            for h in self.succ[u]:
                if h in dom[u]:  # a back edge u -> h
                    body = bodies.setdefault(h, {h})
                    work = [u]
                    while work:
                        b = work.pop()
                        if b not in body:
                            body.add(b)
                            work += self.pred[b]
        loops = sorted((_Loop(h, body) for h, body in bodies.items()),
                       key=lambda lp: len(lp.blocks))
        outer: list[_Loop] = []
        for i, lp in enumerate(loops):
            parent = next((p for p in loops[i + 1:] if lp.blocks < p.blocks), None)
            (parent.inner if parent else outer).append(lp)
        return outer


# --- trip counts --------------------------------------------------------------------------

Affine = dict[str, int]  # symbol -> coefficient; "" is the constant


def _add(a: Affine, b: Affine, scale: int = 1) -> Affine:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + scale * v
    return {k: v for k, v in out.items() if v or k == ""}


class _Trips:
    """Constant trip counts: induction phis (a start plus a constant step per iteration,
    as an affine form of the loops' iteration counters) compared in the exiting branch."""

    def __init__(self, g: _Graph):
        self.g = g
        self.header_of: dict[str, _Loop] = {}
        self.active: set[str] = set()  # phis whose step is being read

    def affine(self, value: str, depth: int = 0) -> Affine:
        if _INT.fullmatch(value):
            return {"": int(value)}
        ins = self.g.by_name.get(value)
        if ins is None or depth > 24:
            return {value: 1}
        op, args = ins.opcode, [a.strip() for a in ins.operands.split(",")]
        operand = [a.split(" ")[-1] for a in args]
        if op == "phi":
            return self._induction(ins, depth)
        if op in ("zext", "sext", "trunc", "freeze"):
            return self.affine(ins.uses[0] if ins.uses else args[0].split(" ")[1], depth + 1)
        if op in ("add", "or", "sub") and len(operand) == 2:
            scale = -1 if op == "sub" else 1
            return _add(self.affine(operand[0], depth + 1), self.affine(operand[1], depth + 1),
                        scale)
        if op in ("mul", "shl") and len(operand) == 2 and _INT.fullmatch(operand[1]):
            factor = int(operand[1]) if op == "mul" else 1 << int(operand[1])
            return {k: v * factor for k, v in self.affine(operand[0], depth + 1).items()}
        return {value: 1}

    def _induction(self, phi: Instruction, depth: int) -> Affine:
        name = phi.result or ""
        loop = self.header_of.get(self.g.defined[name])
        edges = _EDGE.findall(phi.operands)
        if loop is None or len(edges) != 2 or name in self.active:
            return {name: 1}
        (start, _), (step, _) = sorted(edges, key=lambda e: e[1] in loop.blocks)
        self.active.add(name)
        advanced = self.affine(step.strip(), depth + 1)
        self.active.discard(name)
        if set(advanced) != {name, ""} or advanced[name] != 1:
            return {name: 1}
        return _add(self.affine(start.strip(), depth + 1), {f"k{loop.header}": advanced[""]})

    def count(self, loop: _Loop) -> int | None:
        exits = [b for b in loop.blocks if any(s not in loop.blocks for s in self.g.succ[b])]
        if len(exits) != 1:
            return None
        m = re.fullmatch(r"br i1 (%[-\w.$]+), label (%[-\w.$]+), label (%[-\w.$]+)",
                         self.g.blocks[exits[0]].terminator.text)
        cond = self.g.by_name.get(m.group(1)) if m else None
        if cond is None or cond.opcode != "icmp":
            return None
        words = [w for w in cond.operands.split(" ") if w != "samesign"]
        x, y = (a.strip() for a in " ".join(words[2:]).split(","))
        d = _add(self.affine(x), self.affine(y), -1)
        k = f"k{loop.header}"
        if set(d) - {"", k} or not d.get(k):
            return None
        exit_when = m.group(2) not in loop.blocks
        for i in range(_LONGEST_TRIP):
            if _compare(words[0], d.get("", 0) + d[k] * i) == exit_when:
                return i + 1
        return None


def _compare(predicate: str, difference: int) -> bool:
    """`x pred y` from x - y (as integers: the counters of a constant loop are small)."""
    kind = predicate[-2:] if predicate not in ("eq", "ne") else predicate
    return {"eq": difference == 0, "ne": difference != 0, "lt": difference < 0,
            "le": difference <= 0, "gt": difference > 0, "ge": difference >= 0}[kind]


# --- critical paths -----------------------------------------------------------------------


class _Timing:
    """Earliest finishing step of each value, relative to the start of a region."""

    def __init__(self, g: _Graph, latency: Callable[[Instruction], int]):
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

    def body(self, loop: _Loop | None, blocks: Sequence[str], time: dict[str, int],
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

    def _collapsed(self, m: _Loop, time: dict[str, int], memory: dict[str, int]) -> None:
        """A constant loop as one node: it starts when its inputs are ready and its
        values and arrays are ready its whole length later; other loops take no time
        in the region around them (they are regions of their own)."""
        instructions = [i for b in m.blocks for i in self.g.blocks[b].instructions]
        inside = {i.result for i in instructions if i.result}
        arrays = {a for i in instructions for a in self.arrays(i)}
        start = max([0, *(time.get(u, 0) for i in instructions for u in i.uses
                          if u not in inside), *(memory.get(a, 0) for a in arrays)])
        end = start + (self.length(m) if m.constant else 0)
        for name in inside:
            time[name] = end
        for a in arrays:
            if any(i.opcode in ("store", "call") and a in self.arrays(i) for i in instructions):
                memory[a] = max(memory.get(a, 0), end)

    def length(self, m: _Loop) -> int:
        """The critical path of all of a constant loop's iterations, overlapped."""
        if m.header not in self.lengths:
            self.lengths[m.header] = self._simulate(m)
        return self.lengths[m.header]

    def _simulate(self, m: _Loop) -> int:
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

    def _back_edge_time(self, phi: Instruction, m: _Loop, time: dict[str, int]) -> int:
        return max([0, *(time.get(v.strip(), 0) for v, pred in _EDGE.findall(phi.operands)
                         if pred in m.blocks)])

    def _carried_arrays(self, m: _Loop, blocks: Sequence[str]) -> set[str]:
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

    def _moving(self, m: _Loop) -> set[str]:
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


def _annotate(trips: _Trips, loops: list[_Loop]) -> None:
    """Sets the trip count of every loop (outer loops' headers are known first: an
    inner loop's bounds may step with them)."""
    for lp in loops:
        trips.header_of[lp.header] = lp
    for lp in loops:
        _annotate(trips, lp.inner)
        lp.trips = trips.count(lp)


def _regions(loops: list[_Loop], outside: set[str]) -> list[tuple[_Loop, set[str]]]:
    """(loop, its own blocks) of the regions among `loops` and inside them: a loop that
    is not constant and its blocks outside the regions within it. Their blocks are taken
    out of `outside`, the blocks of the region around them."""
    out: list[tuple[_Loop, set[str]]] = []
    for lp in loops:
        if lp.constant:
            continue
        own = set(lp.blocks)
        out += _regions(lp.inner, own)
        out.append((lp, own))
        outside -= lp.blocks
    return out


def _multiplicities(loops: list[_Loop], outer: int = 1) -> dict[str, int]:
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
    g = _Graph(f)
    trips = _Trips(g)
    _annotate(trips, g.loops)
    timing = _Timing(g, latency)
    top = set(g.order)
    regions: list[tuple[_Loop | None, set[str]]] = [*_regions(g.loops, top), (None, top)]
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
