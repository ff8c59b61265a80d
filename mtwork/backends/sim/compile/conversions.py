"""Device and threadgroup memory reaching a `thread` pointer, reference or member function,
read from clang's AST of the address-space check.

In C++ for OpenCL an unqualified pointer, reference or member function is in the generic
address space, which holds the global and local ones that Metal's ``device`` and
``threadgroup`` map onto (`address_spaces.py`): clang converts them silently where Metal
refuses (an unqualified pointer, reference or member function is ``thread`` in Metal
before MSL 4.1, MSL 3.2 specification chapter 4). The check has clang print its AST
(``-ast-dump``), and this module finds those conversions (``AddressSpaceConversion`` from
``__global`` or ``__local`` to ``__generic``) and what each was for: an argument of a
function, the object of a member function, a variable's initializer, an assignment, a
return, an explicit cast. Copies of an object (its copy constructor takes any space in
Metal too; so does its implicit assignment) and anything clang's dump does not place are
left alone; whose function or variable it was is decided by the caller from the
declaration's file (`Conversion.target`).

Declarations read from a precompiled header (the shim, MLX's leading headers) are not in
the dump: a conversion into one of their parameters names no file and is left alone, as
Metal's own library declares its functions for every address space.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Conversion", "generic_conversions"]

_SPACE_NAMES = {"__global": "device", "__local": "threadgroup"}
# A node's line: the tree's drawing, the node's kind, its address.
_NODE = re.compile(r"^(?P<indent>[ |`-]*)(?P<kind>[A-Za-z]+)(?: 0x(?P<addr>[0-9a-f]+))?")
# The source locations a line prints, in order: a file's (when it changes), a line's (when
# it changes), or a column's.
_LOCATION = re.compile(r"\bline:(?P<line>\d+):(?P<lcol>\d+)|\bcol:(?P<col>\d+)"
                       r"|(?P<file><scratch space>|<built-in>|[^\s<>,:=][^<>,:=]*?)"
                       r":(?P<fline>\d+):(?P<fcol>\d+)")
_TYPE = re.compile(r"'([^']*)'")
_REFERENCED = re.compile(r"\b(?:Function|CXXMethod|CXXConversion) 0x([0-9a-f]+) '([^']*)'")
_MEMBER = re.compile(r"(?:->|\.)(?P<name>[~\w]+) 0x(?P<addr>[0-9a-f]+)")
_CALLS = ("CallExpr", "CXXMemberCallExpr", "CXXOperatorCallExpr")
_EXPLICIT_CASTS = ("CStyleCastExpr", "CXXStaticCastExpr", "CXXReinterpretCastExpr",
                   "CXXFunctionalCastExpr", "CXXConstCastExpr", "CXXAddrspaceCastExpr")
# Nodes a conversion passes through on its way to what it is for.
_TRANSPARENT = ("ParenExpr", "MaterializeTemporaryExpr", "ExprWithCleanups",
                "CXXBindTemporaryExpr", "ImplicitCastExpr")


@dataclass(frozen=True)
class Conversion:
    """One conversion of device or threadgroup memory into the generic (`thread`) space:
    where it is (`file`, `line`, `column`), which rule it breaks, what to say, and the
    address of the declaration whose parameter or member function it converts for
    (`target`, None when the conversion's place is the author's own statement)."""

    file: str
    line: int
    column: int
    rule: str
    message: str
    target: str | None


@dataclass
class _Node:
    depth: int
    kind: str
    text: str
    place: tuple[str, int, int]
    callee: tuple[str, str] | None = None  # a call's function: its address and name
    children: int = 0


class _Locations:
    """The dump's location state: a location names its file and line only when they
    change, so every location is read in order."""

    def __init__(self) -> None:
        self.file, self.line = "", 0

    def read(self, text: str) -> list[tuple[str, int, int]]:
        out = []
        for m in _LOCATION.finditer(text):
            if m.group("file"):
                self.file, self.line = m.group("file"), int(m.group("fline"))
                out.append((self.file, self.line, int(m.group("fcol"))))
            elif m.group("line"):
                self.line = int(m.group("line"))
                out.append((self.file, self.line, int(m.group("lcol"))))
            else:
                out.append((self.file, self.line, int(m.group("col"))))
        return out


def _space(type_text: str) -> str | None:
    """The address space of what a pointer or reference type points at (the pointer's own
    space, after its ``*``, left out)."""
    text = re.sub(r"\*\s*__\w+", "*", type_text)
    found = re.search(r"\b(__global|__local|__constant|__private|__generic)\b", text)
    return found.group(1) if found else None


def _metal_type(type_text: str, node: str) -> str:
    """A type of the dump in Metal's words (a reference when the node is an lvalue)."""
    text = re.sub(r"\*\s*__\w+", "*", type_text)
    if re.search(r"'\s+(?:contains-errors\s+)?lvalue\b", node) and not text.endswith("*"):
        text += " &"
    for opencl, metal in (("__global", "device"), ("__local", "threadgroup"),
                          ("__constant", "constant"), ("__private ", ""), ("__generic ", ""),
                          ("__mtw_half", "half")):
        text = text.replace(opencl, metal)
    return text


def generic_conversions(dump: str) -> tuple[list[Conversion], dict[str, str]]:
    """The conversions of device and threadgroup memory to the generic space in `dump`
    (clang's ``-ast-dump`` text), and the file of every declaration the dump holds, by
    address ("" for one the compiler declared)."""
    where = _Locations()
    declared: dict[str, str] = {}
    stack: list[_Node] = []
    found: list[Conversion] = []
    pending: _Node | None = None  # a conversion whose source is its first child
    for text in dump.splitlines():
        m = _NODE.match(text)
        if m is None:
            continue
        # Locations come before the node's name and types (quoted: never read as places).
        places = where.read(re.split(r"['\"]", text[m.end():], maxsplit=1)[0])
        depth, kind = len(m.group("indent")), m.group("kind")
        while stack and stack[-1].depth >= depth:
            stack.pop()
        if stack:
            stack[-1].children += 1
        node = _Node(depth, kind, text, places[0] if places else (where.file, where.line, 0))
        if kind.endswith("Decl") and m.group("addr"):
            # An implicit member (a copy assignment, ...) is nobody's: Metal's take any space.
            declared[m.group("addr")] = "" if " implicit " in text else where.file
        _note_callee(stack, kind, text)
        if pending is not None:
            conversion = _conversion(pending, stack, text)
            if conversion is not None:
                found.append(conversion)
            pending = None
        if "<AddressSpaceConversion>" in text:
            types = _TYPE.findall(text)
            if types and _space(types[0]) == "__generic":
                pending = node
        stack.append(node)
    return found, declared


def _note_callee(stack: list[_Node], kind: str, text: str) -> None:
    """A call's function is the first declaration its first child refers to."""
    call = next((n for n in reversed(stack) if n.kind in _CALLS), None)
    if call is None or call.callee is not None or call.children > 1:
        return
    if kind == "MemberExpr":
        m = _MEMBER.search(text)
        if m:
            call.callee = (m.group("addr"), m.group("name"))
    elif kind == "DeclRefExpr":
        m = _REFERENCED.search(text)
        if m:
            call.callee = (m.group(1), m.group(2))


def _conversion(cast: _Node, ancestors: list[_Node], source: str) -> Conversion | None:
    """What the conversion `cast` (whose operand's line is `source`) is for, when it is a
    conversion Metal refuses."""
    types = _TYPE.findall(source)
    space = _SPACE_NAMES.get(_space(types[0]) if types else "")
    if space is None:
        return None
    to_type = _metal_type(_TYPE.findall(cast.text)[0], cast.text)
    from_type = _metal_type(types[0], source)
    file, line, column = cast.place
    if cast.kind in _EXPLICIT_CASTS:
        return Conversion(file, line, column, "address-space-conversion",
                          f"cast from '{from_type}' to '{to_type}' converts between "
                          f"mismatching address spaces ({space} to thread)", None)
    parents = [n for n in ancestors if n.depth < cast.depth]
    user = next((n for n in reversed(parents) if n.kind not in _TRANSPARENT), None)
    if user is None:
        return None
    if user.kind == "MemberExpr":
        m = _MEMBER.search(user.text)
        if m is None:
            return None
        return Conversion(file, line, column, "member-address-space",
                          f"'this' object is in address space '{space}', but member "
                          f"function '{m.group('name')}' is not marked {space} (it expects "
                          f"an object in address space 'thread')", m.group("addr"))
    if user.kind in _CALLS:
        if user.callee is None:
            return None
        address, name = user.callee
        return Conversion(file, line, column, "address-space-conversion",
                          f"cannot pass '{from_type}' to '{name}' as '{to_type}': a pointer "
                          f"or reference to {space} memory does not convert to thread",
                          address)
    if user.kind in ("VarDecl", "ReturnStmt") or (
            user.kind in ("BinaryOperator", "CompoundAssignOperator") and "'='" in user.text):
        what = {"VarDecl": "initialize", "ReturnStmt": "return"}.get(user.kind, "assign")
        return Conversion(file, line, column, "address-space-conversion",
                          f"cannot {what} '{to_type}' with '{from_type}': a pointer or "
                          f"reference to {space} memory does not convert to thread", None)
    return None
