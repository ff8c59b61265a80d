"""A reader of the LLVM IR text clang writes (``-S -emit-llvm``): functions, basic blocks,
instructions with their operands and debug locations, the chain of inlined frames behind a
location, and the sizes of types. Enough for the profiler (instrument.py) to count what a
kernel's blocks do and to insert calls; it reads what clang writes, not every form the
language allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import PurePosixPath

__all__ = ["Block", "Frame", "Function", "Instruction", "Module", "element_type",
           "type_bytes"]

_METADATA = re.compile(r"^!(\d+) = (?:distinct )?!(\w+)\((.*)\)\s*$")
_FIELD = re.compile(r'(\w+): ("(?:[^"\\]|\\.)*"|[^,]+)')
_LABEL = re.compile(r"^([-\w.$]+):(?:\s*;.*)?$")
_RESULT = re.compile(r"^(%[-\w.$]+) = ")
_DBG = re.compile(r", !dbg !(\d+)")
_ATTACHMENTS = re.compile(r", !(?:[\w.]+) !\d+")
_VALUE = re.compile(r"%[-\w.$]+")
_LABEL_USE = re.compile(r"label (%[-\w.$]+)")
_NAMED_TYPE = re.compile(r'^(%(?:"[^"]+"|[-\w.$]+)) = type (.*)$')


def _unquote(text: str) -> str:
    if text.startswith('"'):
        text = text[1:-1]
        return re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    return text


@dataclass(frozen=True)
class Frame:
    """One frame of a debug location: the function (its name and file) and the line in
    it; `site` is the location the function was inlined at (None for the outermost)."""

    function: str
    file: str
    line: int
    site: int | None


@dataclass
class Instruction:
    line: int  # index of its (first) line in the module's text
    text: str  # without indentation and metadata attachments
    result: str | None
    opcode: str
    dbg: int | None

    @cached_property
    def operands(self) -> str:
        """The text after the result and the opcode (and "tail" before a call)."""
        body = self.text.split(" = ", 1)[1] if self.result else self.text
        words = body.split(" ")
        return " ".join(words[words.index(self.opcode) + 1:])

    @cached_property
    def uses(self) -> tuple[str, ...]:
        body = self.text.split(" = ", 1)[1] if self.result else self.text
        return tuple(_VALUE.findall(body))

    @property
    def callee(self) -> str | None:
        if self.opcode != "call":
            return None
        m = re.search(r"@([-\w.$]+)\(", self.text)
        return m.group(1) if m else None


@dataclass
class Block:
    label: str  # "%12"
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def terminator(self) -> Instruction:
        return self.instructions[-1]

    def successors(self) -> list[str]:
        return _LABEL_USE.findall(self.terminator.text)

    def first_non_phi(self) -> Instruction:
        return next(i for i in self.instructions if i.opcode != "phi")


@dataclass
class Function:
    name: str
    header: str
    dbg: int | None
    arguments: list[tuple[str, str]]  # (type, name)
    blocks: list[Block]


def _opcode(text: str, result: str | None) -> str:
    body = text.split(" = ", 1)[1] if result else text
    words = body.split(" ")
    for i, word in enumerate(words):  # "tail call", "musttail call", "notail call"
        if word in ("tail", "musttail", "notail") and i + 1 < len(words):
            continue
        return word
    return words[0]


def _function(header: str) -> Function:
    """A function from its `define` line (name, debug subprogram, arguments)."""
    at = header.index(" @") + 2
    paren = header.index("(", at)
    depth, end = 0, paren
    for end in range(paren, len(header)):
        depth += {"(": 1, ")": -1}.get(header[end], 0)
        if depth == 0:
            break
    arguments = []
    for part in _split_top(header[paren + 1:end]):
        names = _VALUE.findall(part)
        if names and part.split(" ")[-1] == names[-1]:
            arguments.append((part.split(" ", 1)[0], names[-1]))
    dbg = re.search(r"!dbg !(\d+)", header[end:])
    return Function(_unquote(header[at:paren]), header, int(dbg.group(1)) if dbg else None,
                    arguments, [])


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets and quotes."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


class Module:
    """One module's text, its functions, metadata and named types."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.metadata: dict[int, tuple[str, dict[str, str]]] = {}
        self.types: dict[str, str] = {}
        self.functions: list[Function] = []
        self._read()

    # --- reading -----------------------------------------------------------------------

    def _read(self) -> None:
        current: Function | None = None
        open_instruction = False  # a switch whose cases go on over the next lines
        for index, raw in enumerate(self.lines):
            if current is not None:
                if raw == "}":
                    current = None
                elif open_instruction:
                    last = current.blocks[-1].instructions[-1]
                    last.text += " " + raw.strip()
                    open_instruction = not raw.strip().startswith("]")
                else:
                    open_instruction = self._read_body_line(current, index, raw)
            elif raw.startswith("define "):
                current = _function(raw)
                self.functions.append(current)
            elif raw.startswith("!"):
                m = _METADATA.match(raw)
                if m:
                    fields = {k: v.strip() for k, v in _FIELD.findall(m.group(3))}
                    self.metadata[int(m.group(1))] = (m.group(2), fields)
            elif raw.startswith("%"):
                m = _NAMED_TYPE.match(raw)
                if m:
                    self.types[m.group(1)] = m.group(2)

    def _read_body_line(self, f: Function, index: int, raw: str) -> bool:
        """Reads one line of a function body; True when an instruction goes on below."""
        label = _LABEL.match(raw)
        if label:
            f.blocks.append(Block("%" + label.group(1)))
            return False
        stripped = raw.strip()
        if not stripped or stripped.startswith((";", "#dbg_")):
            return False
        if not f.blocks:  # the entry block has no label: it takes the next number
            unnamed = sum(1 for _, n in f.arguments if n[1:].isdigit())
            f.blocks.append(Block(f"%{unnamed}"))
        dbg = _DBG.search(stripped)
        text = _ATTACHMENTS.sub("", stripped)
        result = _RESULT.match(text)
        name = result.group(1) if result else None
        f.blocks[-1].instructions.append(Instruction(index, text, name, _opcode(text, name),
                                                     int(dbg.group(1)) if dbg else None))
        return text.endswith("[")

    # --- debug locations -----------------------------------------------------------------

    def field(self, node: int, key: str) -> str | None:
        kind_fields = self.metadata.get(node)
        return kind_fields[1].get(key) if kind_fields else None

    def _ref(self, node: int, key: str) -> int | None:
        value = self.field(node, key)
        return int(value[1:]) if value and value.startswith("!") and value[1:].isdigit() \
            else None

    @cache  # noqa: B019 - one module, read once
    def file_path(self, file_node: int) -> str:
        name = _unquote(self.field(file_node, "filename") or '""')
        folder = _unquote(self.field(file_node, "directory") or '""')
        if name.startswith("/") or not folder or name.startswith("<"):
            return name
        return str(PurePosixPath(folder) / name)

    @cache  # noqa: B019
    def scope(self, node: int) -> tuple[str, str]:
        """(function name, file path) of a scope: a subprogram or a block inside one."""
        file_node = self._ref(node, "file")
        path = self.file_path(file_node) if file_node is not None else ""
        kind = self.metadata.get(node, ("", {}))[0]
        if kind == "DISubprogram":
            return _unquote(self.field(node, "name") or '""'), path
        parent = self._ref(node, "scope")
        function = self.scope(parent)[0] if parent is not None else ""
        return function, path

    @cache  # noqa: B019
    def chain(self, location: int) -> tuple[Frame, ...]:
        """The frames of a debug location, innermost first."""
        frames = []
        loc: int | None = location
        while loc is not None:
            scope = self._ref(loc, "scope")
            function, path = self.scope(scope) if scope is not None else ("", "")
            site = self._ref(loc, "inlinedAt")
            frames.append(Frame(function, path, int(self.field(loc, "line") or 0), site))
            loc = site
        return tuple(frames)

    def compile_unit_file(self) -> str:
        for node, (kind, _) in self.metadata.items():
            if kind == "DICompileUnit":
                file_node = self._ref(node, "file")
                return self.file_path(file_node) if file_node is not None else ""
        return ""

    def function_file(self, f: Function) -> str:
        return self.scope(f.dbg)[1] if f.dbg is not None else ""

    # --- writing ---------------------------------------------------------------------------

    def with_lines(self, before: dict[int, list[str]], appended: list[str],
                   dropped: set[int] | frozenset[int] = frozenset()) -> str:
        """The module's text with `before[i]` inserted before line i, the lines in
        `dropped` left out, and `appended` at the end."""
        out = []
        for index, raw in enumerate(self.lines):
            out.extend("  " + text for text in before.get(index, ()))
            if index not in dropped:
                out.append(raw)
        out.extend(appended)
        return "\n".join(out) + "\n"

    # --- types -------------------------------------------------------------------------------

    def bytes_of(self, type_text: str) -> float:
        """The size of a type in bytes (no padding; 1 bit for i1 rounds to 1/8)."""
        return type_bytes(type_text, self.types)


_SCALARS = {"half": 2, "bfloat": 2, "float": 4, "double": 8, "ptr": 8, "void": 0,
            "label": 0, "metadata": 0, "token": 0, "x86_fp80": 10, "fp128": 16}


def type_bytes(type_text: str, named: dict[str, str] | None = None) -> float:
    t = type_text.strip()
    if t in _SCALARS:
        return _SCALARS[t]
    if t.startswith("i") and t[1:].isdigit():
        return int(t[1:]) / 8
    m = re.fullmatch(r"[<\[]\s*(\d+) x (.*)[>\]]", t)
    if m:
        return int(m.group(1)) * type_bytes(m.group(2), named)
    if t.startswith("<{") or t.startswith("{"):
        inner = t.strip("<>")[1:-1]
        return sum(type_bytes(p, named) for p in _split_top(inner))
    if named and t in named:
        return 0 if named[t] == "opaque" else type_bytes(named[t], named)
    return 8  # pointers in older spellings, or something unknown: a register pair


def element_type(type_text: str) -> tuple[int, str]:
    """(lanes, element) of a scalar or vector type: `<4 x float>` is (4, "float")."""
    m = re.fullmatch(r"<\s*(\d+) x (.*)>", type_text.strip())
    if m:
        return int(m.group(1)), m.group(2).strip()
    return 1, type_text.strip()
