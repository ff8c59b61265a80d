"""Textual LLVM IR, as clang prints it: a module's functions as blocks of instructions.

Only what the engine's pass needs is modelled: each instruction keeps its text, the local
name it defines, its opcode and the local names it refers to; each function keeps its
header, parameters and blocks in order; everything else in the module (types, globals,
declarations, metadata, attributes) is kept as text. Local names are renamed through
`rename`, which leaves string literals and global names alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["Block", "Function", "Instruction", "IRError", "Module", "parse_module", "rename"]

_NAME = r'(?:"[^"]*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*|\d+)'
_TOKENS = re.compile(rf'(?P<local>%{_NAME})|(?P<global>@{_NAME})|(?P<string>c?"[^"]*")')
_RESULT = re.compile(rf"^(%{_NAME}) = (.*)$", re.S)
_LABEL = re.compile(rf"^({_NAME}):(?:\s|;|$)")
_LABEL_REF = re.compile(rf"\blabel (%{_NAME})")
_DEFINE = re.compile(rf"^define\b.*?(@{_NAME})\((.*)\)(.*)\{{\s*$")
_CALLEE = re.compile(rf"\bcall\b.*?([@%]{_NAME})\(")
_PREFIXES = frozenset({"tail", "musttail", "notail"})
TERMINATORS = frozenset({"br", "switch", "ret", "unreachable", "indirectbr", "invoke",
                         "callbr", "resume", "cleanupret", "catchret", "catchswitch"})


class IRError(Exception):
    """The IR uses something the engine's pass does not handle; the message says what."""


def rename(text: str, mapping: Mapping[str, str] | Callable[[str], str | None]) -> str:
    """`text` with each local name (`%x`) replaced through `mapping` (names it does not
    know stay as they are); string literals and global names are left alone."""
    get = mapping.get if isinstance(mapping, Mapping) else mapping

    def replace(m: re.Match[str]) -> str:
        if m.group("local") is None:
            return m.group(0)
        new = get(m.group(0))
        return m.group(0) if new is None else new

    return _TOKENS.sub(replace, text)


def locals_in(text: str) -> Iterator[str]:
    """The local names `text` refers to, in order (with repeats)."""
    for m in _TOKENS.finditer(text):
        if m.group("local") is not None:
            yield m.group(0)


@dataclass
class Instruction:
    """One instruction: `text` without its indentation (a switch keeps its case lines)."""

    text: str
    result: str | None = None
    opcode: str = ""

    @classmethod
    def parse(cls, text: str) -> Instruction:
        m = _RESULT.match(text)
        result, rest = (m.group(1), m.group(2)) if m else (None, text)
        words = rest.split(None, 2)
        opcode = words[0] if words else ""
        if opcode in _PREFIXES and len(words) > 1:
            opcode = words[1]
        return cls(text, result, opcode)

    @property
    def is_terminator(self) -> bool:
        return self.opcode in TERMINATORS

    @property
    def callee(self) -> str | None:
        """The called function's name (`@f`, or a local for an indirect call)."""
        if self.opcode != "call":
            return None
        m = _CALLEE.search(self.text)
        return m.group(1) if m else None

    def operands(self) -> list[str]:
        """The local names this instruction uses (its result excluded), in order."""
        body = self.text if self.result is None else self.text[len(self.result) + 3:]
        return list(locals_in(body))

    def successors(self) -> list[str]:
        """The blocks a terminator may branch to, in order, without repeats."""
        return list(dict.fromkeys(_LABEL_REF.findall(self.text)))

    def incoming(self) -> list[tuple[str, str]]:
        """A phi's (value text, predecessor block) pairs."""
        if self.opcode != "phi":
            raise ValueError("not a phi")
        pairs, depth, start = [], 0, -1
        for k, c in enumerate(self.text):
            if c in "[<({":
                if c == "[" and depth == 0:
                    start = k + 1
                depth += 1
            elif c in "]>)}":
                depth -= 1
                if c == "]" and depth == 0 and start >= 0:
                    inner = self.text[start:k]
                    value, _, block = inner.rpartition(",")
                    pairs.append((value.strip(), block.strip()))
                    start = -1
        return pairs

    def renamed(self, mapping: Mapping[str, str] | Callable[[str], str | None]) -> Instruction:
        text = rename(self.text, mapping)
        result = rename(self.result, mapping) if self.result else None
        return Instruction(text, result, self.opcode)


@dataclass
class Block:
    name: str  # the local name, e.g. "%12"
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def terminator(self) -> Instruction:
        return self.instructions[-1]

    @property
    def phis(self) -> list[Instruction]:
        return [i for i in self.instructions if i.opcode == "phi"]

    def successors(self) -> list[str]:
        return self.terminator.successors()


@dataclass
class Function:
    name: str  # e.g. "@mtw_engine_thread"
    header: str  # the `define ... {` line
    params: list[str]  # local names of the parameters, in order
    blocks: list[Block]

    def block_map(self) -> dict[str, Block]:
        return {b.name: b for b in self.blocks}

    def text(self) -> str:
        lines = [self.header]
        for k, block in enumerate(self.blocks):
            if k:
                lines.append("")
            lines.append(block.name[1:] + ":")
            lines += ["  " + i.text.replace("\n", "\n  ") for i in block.instructions]
        lines.append("}")
        return "\n".join(lines)

    def values(self) -> set[str]:
        """Every local value: parameters and instruction results."""
        out = set(self.params)
        for b in self.blocks:
            out.update(i.result for i in b.instructions if i.result)
        return out


def _params(text: str) -> list[str]:
    """The parameter names of a `define` line's parameter list."""
    names, depth, part = [], 0, []
    for c in text + ",":
        if c == "," and depth == 0:
            found = list(locals_in("".join(part)))
            if found:
                names.append(found[-1])
            part = []
            continue
        depth += c in "([{<"
        depth -= c in ")]}>"
        part.append(c)
    return names


def _join_continuations(lines: list[str]) -> Iterator[str]:
    """Body lines with each multi-line instruction (a switch's cases) as one item."""
    pending: list[str] = []
    for line in lines:
        if pending:
            pending.append(line.strip())
            if line.strip() == "]":
                yield "\n".join(pending)
                pending = []
            continue
        if line.rstrip().endswith("[") and line.startswith("  "):
            pending = [line.strip()]
            continue
        yield line


def _parse_function(lines: list[str]) -> Function:
    m = _DEFINE.match(lines[0])
    if not m:
        raise IRError(f"unexpected function header: {lines[0][:120]}")
    params = _params(m.group(2))
    blocks: list[Block] = []
    current: Block | None = None
    for line in _join_continuations(lines[1:-1]):
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        label = _LABEL.match(line)
        if label:
            current = Block("%" + label.group(1))
            blocks.append(current)
            continue
        if current is None:  # the entry block has no label: its number follows the params
            numbered = sum(p[1:].isdigit() for p in params)
            current = Block(f"%{numbered}")
            blocks.append(current)
        current.instructions.append(Instruction.parse(line.strip() if "\n" not in line
                                                      else line))
    return Function(m.group(1), lines[0], params, blocks)


@dataclass
class Module:
    """A module as text pieces: `functions` by name, and the text around them."""

    pieces: list[str | Function]

    @property
    def functions(self) -> dict[str, Function]:
        return {p.name: p for p in self.pieces if isinstance(p, Function)}

    def type_names(self) -> set[str]:
        text = "\n".join(p for p in self.pieces if isinstance(p, str))
        return set(re.findall(rf"^(%{_NAME}) = type\b", text, re.M))

    def text(self) -> str:
        return "\n".join(p if isinstance(p, str) else p.text() for p in self.pieces) + "\n"


def parse_module(text: str) -> Module:
    """Splits a module into its function definitions and the text between them."""
    pieces: list[str | Function] = []
    lines = text.split("\n")
    k, plain = 0, []
    while k < len(lines):
        if lines[k].startswith("define "):
            end = k
            while lines[end] != "}":
                end += 1
            if plain:
                pieces.append("\n".join(plain))
                plain = []
            pieces.append(_parse_function(lines[k:end + 1]))
            k = end + 1
            continue
        plain.append(lines[k])
        k += 1
    if plain:
        pieces.append("\n".join(plain).rstrip("\n"))
    return Module(pieces)
