"""LLVM types in textual IR: parsing a type, and the type an instruction produces.

The engine keeps values that live across a barrier in memory, so it needs each one's
type; textual IR writes it in a place that depends on the opcode.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .ir import Instruction, IRError

__all__ = ["Type", "parse_type", "result_type"]


@dataclass(frozen=True)
class Type:
    """A parsed type: `kind` is "scalar", "vector", "array", "struct" or "named"; `count`
    the elements of a vector or array; `parts` the element type(s)."""

    text: str
    kind: str
    count: int = 0
    parts: tuple[Type, ...] = ()

    def element(self, index: int, named: Mapping[str, Type]) -> Type:
        """The type of element `index` of an aggregate (extractvalue's rule)."""
        t = named[self.text] if self.kind == "named" else self
        if t.kind == "struct":
            return t.parts[index]
        if t.kind in ("array", "vector"):
            return t.parts[0]
        raise IRError(f"type {self.text} has no elements")


_SCALAR = re.compile(r"(?:i\d+|half|bfloat|float|double|x86_fp80|fp128|ppc_fp128|void|"
                     r"label|token|metadata|x86_amx)\b|ptr(?: addrspace\(\d+\))?")
_NAMED = re.compile(r'%(?:"[^"]*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*|\d+)')


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    return pos


def _aggregate(text: str, pos: int, close: str) -> tuple[list[Type], int]:
    """Comma-separated types up to `close`; returns them and the position after it."""
    parts = []
    pos = _skip_space(text, pos)
    while not text.startswith(close, pos):
        part, pos = parse_type(text, pos)
        parts.append(part)
        pos = _skip_space(text, pos)
        if text.startswith(",", pos):
            pos = _skip_space(text, pos + 1)
    return parts, pos + len(close)


def parse_type(text: str, pos: int = 0) -> tuple[Type, int]:
    """The type starting at `text[pos]` (spaces skipped) and the position after it."""
    pos = _skip_space(text, pos)
    m = _SCALAR.match(text, pos)
    if m:
        end = m.end()
        return Type(m.group(0), "scalar"), end
    m = _NAMED.match(text, pos)
    if m:
        return Type(m.group(0), "named"), m.end()
    if text.startswith("<{", pos) or text.startswith("{", pos):
        packed = text.startswith("<{", pos)
        parts, end = _aggregate(text, pos + (2 if packed else 1), "}>" if packed else "}")
        return Type(text[pos:end], "struct", len(parts), tuple(parts)), end
    m = re.compile(r"([<\[])\s*(?:vscale x )?(\d+) x ").match(text, pos)
    if m:
        element, end = parse_type(text, m.end())
        end = _skip_space(text, end)
        close = ">" if m.group(1) == "<" else "]"
        if not text.startswith(close, end):
            raise IRError(f"unexpected type syntax: {text[pos:pos + 60]}")
        kind = "vector" if close == ">" else "array"
        return Type(text[pos:end + 1], kind, int(m.group(2)), (element,)), end + 1
    raise IRError(f"unexpected type syntax: {text[pos:pos + 60]}")


_FLAGS = frozenset({"nuw", "nsw", "exact", "disjoint", "nneg", "samesign", "fast", "nnan",
                    "ninf", "nsz", "arcp", "contract", "afn", "reassoc", "volatile", "atomic",
                    "weak", "inbounds", "tail", "musttail", "notail", "fastcc", "coldcc",
                    "ccc", "noundef", "nonnull", "noalias", "zeroext", "signext", "inreg",
                    "dso_local", "local_unnamed_addr", "immarg"})
# Return attributes that take an argument: `align 4`, `dereferenceable(8)`, `range(i32 0, 3)`.
_ATTRIBUTE = re.compile(r"(?:align \d+|dereferenceable(?:_or_null)?\(\d+\)|"
                        r"range\([^)]*\)|nofpclass\([^)]*\)|cc \d+)\s*")
_BINARY = frozenset({"add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr",
                     "and", "or", "xor", "fadd", "fsub", "fmul", "fdiv", "frem", "fneg",
                     "freeze", "phi", "load", "insertvalue", "insertelement"})
_CASTS = frozenset({"trunc", "zext", "sext", "fptrunc", "fpext", "fptoui", "fptosi", "uitofp",
                    "sitofp", "ptrtoint", "inttoptr", "bitcast", "addrspacecast"})


def _after_words(text: str, pos: int) -> int:
    """Skips flags and attributes (and one `icmp`/`fcmp` predicate word is not a flag)."""
    while True:
        pos = _skip_space(text, pos)
        m = _ATTRIBUTE.match(text, pos)
        if m:
            pos = m.end()
            continue
        word = re.match(r"[a-z_]+\b", text[pos:])
        if word and word.group(0) in _FLAGS:
            pos += word.end()
            continue
        return pos


def _vector_of(like: Type, element: str) -> str:
    return f"<{like.count} x {element}>" if like.kind == "vector" else element


def _binary(body: str, start: int) -> Type:
    return parse_type(body, _after_words(body, start))[0]


def _cast(body: str, start: int) -> Type:
    return parse_type(body, body.rindex(" to ") + 4)[0]


def _compare(body: str, start: int) -> Type:
    pos = _after_words(body, start)
    pos = _after_words(body, body.index(" ", pos))  # after the predicate
    return parse_type(_vector_of(parse_type(body, pos)[0], "i1"))[0]


def _pointer(body: str, start: int) -> Type:
    if re.search(r"<\d+ x ", body[start:]) and "getelementptr" in body[:start]:
        raise IRError("vector getelementptr")
    return Type("ptr", "scalar")


def _select(body: str, start: int) -> Type:
    _, pos = parse_type(body, _after_words(body, start))
    return parse_type(body, body.index(",", pos) + 1)[0]


def _extractelement(body: str, start: int) -> Type:
    return parse_type(body, _after_words(body, start))[0].parts[0]


def _shufflevector(body: str, start: int) -> Type:
    first, _ = parse_type(body, _after_words(body, start))
    mask = re.search(r",\s*<(\d+) x i32>\s*(?:<|zeroinitializer|poison|undef)", body)
    if not mask:
        raise IRError(f"unexpected shufflevector: {body[:80]}")
    return parse_type(f"<{mask.group(1)} x {first.parts[0].text}>")[0]


def _atomicrmw(body: str, start: int) -> Type:
    pos = _after_words(body, start)
    return parse_type(body, body.index(",", body.index(" ", pos)) + 1)[0]


def _cmpxchg(body: str, start: int) -> Type:
    value = parse_type(body, body.index(",") + 1)[0]
    return parse_type(f"{{ {value.text}, i1 }}")[0]


_RESULT_TYPES = {
    **{op: _binary for op in _BINARY | {"call"}},
    **{op: _cast for op in _CASTS},
    "icmp": _compare, "fcmp": _compare, "alloca": _pointer, "getelementptr": _pointer,
    "select": _select, "extractelement": _extractelement, "shufflevector": _shufflevector,
    "atomicrmw": _atomicrmw, "cmpxchg": _cmpxchg,
}


def result_type(instruction: Instruction, named: Mapping[str, Type]) -> Type:
    """The type of the value `instruction` defines."""
    op = instruction.opcode
    body = instruction.text[len(instruction.result or "") + 3:]
    start = body.index(op) + len(op)
    if op == "extractvalue":
        aggregate, pos = parse_type(body, _after_words(body, start))
        t = aggregate
        for index in re.findall(r",\s*(\d+)", body[pos:].split(", !")[0]):
            t = t.element(int(index), named)
        return t
    rule = _RESULT_TYPES.get(op)
    if rule is None:
        raise IRError(f"values made by `{op}` are not handled")
    return rule(body, start)


def named_types(module_text: str) -> dict[str, Type]:
    """The module's named struct types (`%T = type { ... }`), parsed."""
    out = {}
    for m in re.finditer(r'^(%(?:"[^"]*"|[-a-zA-Z$._0-9]+)) = type (.*)$', module_text, re.M):
        if m.group(2).strip() == "opaque":
            continue
        out[m.group(1)] = parse_type(m.group(2))[0]
    return out
