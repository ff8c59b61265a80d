"""The loops of a function's optimised IR: natural loops (by dominators), nested, and the
trip count of each loop whose count is a constant.

A trip count is found for loops that exit through one comparison of induction values:
phis that start at an affine value and add a constant per iteration, written as affine
forms of the loops' iteration counters (so `i` from `4p` to `4p + 4` in a loop over `p`
runs 4 times); the comparison is then tried for each count in turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .llvm_ir import Function, Instruction

__all__ = ["EDGE", "Graph", "Loop"]

EDGE = re.compile(r"\[\s*([^,\]]+),\s*(%[-\w.$]+)\s*\]")  # a phi's [value, block]
_INT = re.compile(r"-?\d+")
_LONGEST_TRIP = 1 << 16  # the longest constant trip count looked for


@dataclass
class Loop:
    """A natural loop: its header, its blocks (inner loops' too), the loops directly
    inside it, and its trip count when that is a constant."""

    header: str
    blocks: set[str]
    inner: list[Loop] = field(default_factory=list)
    trips: int | None = None  # constant trip count, or None

    @property
    def constant(self) -> bool:
        return self.trips is not None and all(m.constant for m in self.inner)


class Graph:
    """A function's blocks, their reverse postorder, and its outermost loops (each with
    the loops inside it and its trip count)."""

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
        _annotate(Trips(self), self.loops)

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

    def _loops(self, dom: dict[str, set[str]]) -> list[Loop]:
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
        loops = sorted((Loop(h, body) for h, body in bodies.items()),
                       key=lambda lp: len(lp.blocks))
        outer: list[Loop] = []
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


class Trips:
    """Constant trip counts: induction phis (a start plus a constant step per iteration,
    as an affine form of the loops' iteration counters) compared in the exiting branch."""

    def __init__(self, g: Graph):
        self.g = g
        self.header_of: dict[str, Loop] = {}
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
        edges = EDGE.findall(phi.operands)
        if loop is None or len(edges) != 2 or name in self.active:
            return {name: 1}
        (start, _), (step, _) = sorted(edges, key=lambda e: e[1] in loop.blocks)
        self.active.add(name)
        advanced = self.affine(step.strip(), depth + 1)
        self.active.discard(name)
        if set(advanced) != {name, ""} or advanced[name] != 1:
            return {name: 1}
        return _add(self.affine(start.strip(), depth + 1), {f"k{loop.header}": advanced[""]})

    def count(self, loop: Loop) -> int | None:
        exits = [b for b in loop.blocks if any(s not in loop.blocks for s in self.g.succ[b])]
        if len(exits) != 1:
            return None
        m = re.fullmatch(r"br i1 (%[-\w.$]+), label (%[-\w.$]+), label (%[-\w.$]+)",
                         self.g.blocks[exits[0]].terminator.text)
        cond = self.g.by_name.get(m.group(1)) if m else None
        if cond is None or cond.opcode != "icmp":
            return None
        words = [w for w in cond.operands.split(" ") if w != "samesign"]
        compared = [a.strip() for a in " ".join(words[2:]).split(",")]
        if len(compared) != 2:
            return None
        d = _add(self.affine(compared[0]), self.affine(compared[1]), -1)
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


def _annotate(trips: Trips, loops: list[Loop]) -> None:
    """Sets the trip count of every loop (outer loops' headers are known first: an
    inner loop's bounds may step with them)."""
    for lp in loops:
        trips.header_of[lp.header] = lp
    for lp in loops:
        _annotate(trips, lp.inner)
        lp.trips = trips.count(lp)
