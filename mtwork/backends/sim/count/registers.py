"""An estimate of the 32-bit registers a kernel's thread needs, from its optimised IR.

The estimate is the most values live at any point of the function (by the usual backward
liveness over its blocks) plus the private arrays it declares:

- a value takes its size in 32-bit registers: 16-bit values half of one (Apple's GPUs have
  16-bit register halves), 64-bit values and pointers two, a vector its components, a
  predicate (i1) none;
- a private array takes its whole size, as Apple's compiler keeps small arrays it can
  index statically in registers (it unrolls their loops);
- the emulator's own values (SIMD-group plumbing, the launcher's bookkeeping, addresses
  into private arrays) do not count.

It ignores what a register allocator does (rematerialisation, reuse across a value's
dead ranges within a block, spills), so it ranks kernels by register pressure rather
than predicting the count Apple's compiler reports.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

from .llvm_ir import Function, Instruction, Module, element_type, type_bytes

__all__ = ["register_estimate"]


class _HasKind(Protocol):
    kind: str


_VALUE = re.compile(r"%[-\w.$]+")
_PHI_EDGE = re.compile(r"\[\s*([^,\]]+),\s*(%[-\w.$]+)\s*\]")


def _trailing_type(text: str) -> str:
    """The type at the end of `text` (`<2 x float>` in "call fast <2 x float>")."""
    text = text.rstrip()
    if text.endswith(">"):
        return text[text.rindex("<"):]
    return text.rsplit(" ", 1)[-1]


def _leading_type(text: str) -> str:
    words = [w for w in text.split(" ") if w not in ("nuw", "nsw", "exact", "disjoint",
                                                     "nneg", "fast", "nnan", "ninf", "nsz",
                                                     "arcp", "contract", "afn", "reassoc",
                                                     "volatile", "atomic")]
    rest = " ".join(words)
    for opening, closing in ("<>", "[]", "{}"):
        if rest.startswith(opening):
            return rest[: _closing(rest, opening, closing) + 1]
    return words[0] if words else ""


def _closing(text: str, opening: str, closing: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == opening) - (ch == closing)
        if depth == 0:
            return i
    return len(text) - 1


def result_type(ins: Instruction) -> str:
    """The type of the value an instruction defines (best effort; "" when unknown)."""
    op, operands = ins.opcode, ins.operands
    if op in ("getelementptr", "alloca", "inttoptr"):
        return "ptr"
    if op in ("icmp", "fcmp"):
        words = [w for w in operands.split(" ") if w != "samesign"]
        lanes, _ = element_type(_leading_type(" ".join(words[1:])))
        return f"<{lanes} x i1>" if lanes > 1 else "i1"
    if op == "select":
        return _leading_type(operands.split(", ", 1)[1])
    if " to " in operands and op not in ("call", "store"):
        return _leading_type(operands.rsplit(" to ", 1)[1])
    if op == "call":
        return _trailing_type(operands.split(" @", 1)[0])
    if op == "extractelement":
        return element_type(_leading_type(operands))[1]
    if op == "shufflevector":
        lanes = element_type(_leading_type(operands.rsplit(", ", 1)[1]))[0]
        return f"<{lanes} x {element_type(_leading_type(operands))[1]}>"
    if op == "extractvalue":
        return "i32"
    if op == "cmpxchg":
        return ""
    return _leading_type(operands)


def _registers(type_text: str, named: dict[str, str]) -> float:
    lanes, element = element_type(type_text)
    if element == "i1":
        return 0.0
    return type_bytes(type_text, named) / 4


def _phi_uses(ins: Instruction) -> list[tuple[str, str]]:
    """(value, predecessor) of each incoming edge of a phi."""
    return [(v.strip(), pred) for v, pred in _PHI_EDGE.findall(ins.operands)
            if v.strip().startswith("%")]


def register_estimate(module: Module, f: Function, roles: dict[int, _HasKind]) -> int:
    """See the module docstring; `roles` holds each instruction's role (by id), and values
    of "plumbing" instructions are not counted."""
    sizes: dict[str, float] = {}
    private = set()
    arrays = 0.0
    for _, name in f.arguments:
        sizes[name] = 2.0  # buffer addresses and packed attributes
    for block in f.blocks:
        for ins in block.instructions:
            if not ins.result or roles[id(ins)].kind == "plumbing":
                continue
            if ins.opcode == "alloca":
                private.add(ins.result)
                kind = _leading_type(ins.operands)
                if kind.startswith("["):
                    arrays += type_bytes(kind, module.types) / 4
                continue
            if ins.opcode in ("getelementptr", "bitcast") and set(ins.uses) & private:
                private.add(ins.result)  # an address into a private array
                continue
            size = _registers(result_type(ins), module.types)
            if size:
                sizes[ins.result] = size
    return math.ceil(_most_live(f, sizes) + arrays)


def _block_uses(f: Function, sizes: dict[str, float]
                ) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[tuple[str, str], set]]:
    """Per block: the values it uses before defining them, the values it defines, and
    per (predecessor, block) edge the values its phis take."""
    upward, defs, edges = {}, {}, {}
    for b in f.blocks:
        used, defined = set(), set()
        for ins in b.instructions:
            if ins.opcode == "phi":
                for value, pred in _phi_uses(ins):
                    if value in sizes:
                        edges.setdefault((pred, b.label), set()).add(value)
            else:
                used |= {u for u in ins.uses if u in sizes and u not in defined}
            if ins.result:
                defined.add(ins.result)
        upward[b.label], defs[b.label] = used, defined
    return upward, defs, edges


def _live_out(f: Function, sizes: dict[str, float]) -> dict[str, set[str]]:
    """The values live at the end of each block (iterated to a fixed point)."""
    upward, defs, edges = _block_uses(f, sizes)
    succ = {b.label: b.successors() for b in f.blocks}
    live_in = {b.label: set() for b in f.blocks}
    live_out = {b.label: set() for b in f.blocks}
    changed = True
    while changed:
        changed = False
        for b in reversed(f.blocks):
            out = set().union(*(live_in[s] | edges.get((b.label, s), set())
                                for s in succ[b.label] if s in live_in))
            new_in = upward[b.label] | (out - defs[b.label])
            if out != live_out[b.label] or new_in != live_in[b.label]:
                live_out[b.label], live_in[b.label] = out, new_in
                changed = True
    return live_out


def _most_live(f: Function, sizes: dict[str, float]) -> float:
    """The largest total size of values live at once."""
    most = 0.0
    for b, out in zip(f.blocks, _live_out(f, sizes).values()):
        live = set(out)
        total = sum(sizes[v] for v in live)
        most = max(most, total)
        for ins in reversed(b.instructions):
            if ins.result in live:
                live.discard(ins.result)
                total -= sizes[ins.result]
            if ins.opcode != "phi":
                for u in ins.uses:
                    if u in sizes and u not in live:
                        live.add(u)
                        total += sizes[u]
            most = max(most, total)
    return most
